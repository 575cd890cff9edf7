"""gemm: `y = x @ w.T` of a projection where x arrives split into two bf16 rows (`split_bf16`): the batched
projections' library GEMM (cuBLAS on CUDA, `runtime.cublas`; this definition on other targets and as the spec).

`parts[s] = xs[s] @ w.T` (float32 accumulation of bf16 products), `y = parts[0] + parts[1]`: about 4e-6 relative from
`x @ w.T` at qwen3.5 shapes, where one bf16 row of x costs 2e-3. From `plan.LIBRARY_GEMM_LANES` lanes the tensor-core
GEMMs of cuBLAS take these projections (docs/design.md "Library GEMMs"); `proj` names the projection as for `gemv`
(`config.LIBRARY_GEMMS`), or a `STACKED` one: one GEMM over the stacked weight whose output columns go to one output
per part (`plan.Fusions.library_stacks`), each `[B, N_part]` and contiguous, as the consumers read them.
"""

from __future__ import annotations

from tvm import te

from gdn_tvm.config import STACKED, DecodeConfig
from gdn_tvm.signature import Arg

LIBRARY = "cublas"  # what computes this op on CUDA (no TensorIR kernel there)


def outputs(cfg: DecodeConfig, proj: str) -> list[tuple[str, int]]:
    """(output name, columns) in row order of the weight: `y` of a plain projection, or each `STACKED` part by name."""
    parts = STACKED.get(proj)
    if parts is None:
        return [("y", cfg.model.projections[proj][0])]
    return [(part, cfg.model.projections[part][0]) for part in parts]


def signature(cfg: DecodeConfig, proj: str) -> list[Arg]:
    """w: [N, K] bfloat16 (out, in), xs: [2, B, K] bfloat16 (x's high and low rows) -> y: [B, N] float32, or for a
    stacked projection one output [B, N_part] per part (`outputs`); (N, K) = projections[proj]."""
    N, K = cfg.model.projections[proj]
    B = cfg.batch
    outs = [Arg(name, (B, n), role="out") for name, n in outputs(cfg, proj)]
    return [Arg("w", (N, K), "bfloat16", role="weight"), Arg("xs", (2, B, K), "bfloat16"), *outs]


def make_gemm(cfg: DecodeConfig, proj: str):
    """Blocks "gemm" (`parts`, [2, B, N]) and one per output, named as it, reducing the two parts of its columns."""
    N, K = cfg.model.projections[proj]
    B = cfg.batch
    w = te.placeholder((N, K), "bfloat16", name="w")
    xs = te.placeholder((2, B, K), "bfloat16", name="xs")
    k = te.reduce_axis((0, K), name="k")
    parts = te.compute(
        (2, B, N),
        lambda s, b, n: te.sum(xs[s, b, k].astype("float32") * w[n, k].astype("float32"), axis=k),
        name="gemm",
    )

    def columns(name: str, start: int, width: int) -> te.Tensor:
        s = te.reduce_axis((0, 2), name="s")
        return te.compute((B, width), lambda b, n: te.sum(parts[s, b, start + n], axis=s), name=name)

    outs, start = [], 0
    for name, width in outputs(cfg, proj):
        outs.append(columns(name, start, width))
        start += width
    return te.create_prim_func([w, xs, *outs])
