"""gemm: `y = x @ w.T` of a projection where x arrives split into two bf16 rows (`split_bf16`): the batched
projections' library GEMM (cuBLAS on CUDA, `runtime.cublas`; this definition on other targets and as the spec).

`parts[s] = xs[s] @ w.T` (float32 accumulation of bf16 products), `y = parts[0] + parts[1]`: about 4e-6 relative from
`x @ w.T` at qwen3.5 shapes, where one bf16 row of x costs 2e-3. From `plan.LIBRARY_GEMM_LANES` lanes the tensor-core
GEMMs of cuBLAS take these projections (docs/design.md "Library GEMMs"); `proj` names the projection as for `gemv`
(`config.LIBRARY_GEMMS`).
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg

LIBRARY = "cublas"  # what computes this op on CUDA (no TensorIR kernel there)


def signature(cfg: DecodeConfig, proj: str) -> list[Arg]:
    """w: [N, K] bfloat16 (out, in), xs: [2, B, K] bfloat16 (x's high and low rows) -> y: [B, N] float32;
    (N, K) = projections[proj]."""
    N, K = cfg.model.projections[proj]
    B = cfg.batch
    return [Arg("w", (N, K), "bfloat16", role="weight"), Arg("xs", (2, B, K), "bfloat16"), Arg("y", (B, N), role="out")]


def make_gemm(cfg: DecodeConfig, proj: str):
    N, K = cfg.model.projections[proj]
    B = cfg.batch

    @T.prim_func(s_tir=True)
    def gemm(w: T.Buffer((N, K), "bfloat16"), xs: T.Buffer((2, B, K), "bfloat16"), y: T.Buffer((B, N), "float32")):
        T.func_attr({"tirx.noalias": True})
        parts = T.sblock_alloc_buffer((2, B, N), "float32")
        for s, b, n, k in T.grid(2, B, N, K):
            with T.sblock("gemm"):
                vs, vb, vn, vk = T.axis.remap("SSSR", [s, b, n, k])
                with T.init():
                    parts[vs, vb, vn] = T.float32(0)
                parts[vs, vb, vn] = parts[vs, vb, vn] + T.Cast("float32", xs[vs, vb, vk]) * T.Cast("float32", w[vn, vk])
        for b, n, s in T.grid(B, N, 2):
            with T.sblock("sum"):
                vb, vn, vs = T.axis.remap("SSR", [b, n, s])
                with T.init():
                    y[vb, vn] = T.float32(0)
                y[vb, vn] = y[vb, vn] + parts[vs, vb, vn]

    return gemm
