"""split_bf16: a float32 activation row as the sum of two bf16 rows, the input of a library GEMM.

`xs[0] = bf16(x)`, `xs[1] = bf16(x - xs[0])` (both rounded to the nearest even): `xs[0] + xs[1]` holds x to about
16 significant bits, so a GEMM of bf16 weights over the two rows (`gemm`) keeps a float32 activation's accuracy
where one bf16 row would cost 2^-9 relative (docs/design.md "Library GEMMs"). `x - xs[0]` is exact in float32.
`width` names which activation width K it splits (`config.SPLIT_WIDTHS`).
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig, width: str) -> list[Arg]:
    """x: [B, K] float32 -> xs: [2, B, K] bfloat16 (high, low)."""
    B, K = cfg.batch, cfg.model.split_cols(width)
    return [Arg("x", (B, K)), Arg("xs", (2, B, K), "bfloat16", role="out")]


def bf16_nearest(v):
    """`v` (float32) rounded to the nearest even bf16 value, as float32: a TIR expression, rounding the bits as
    integers (TVM's bf16 legalisation on llvm folds a float32 -> bf16 -> float32 round trip into `v`)."""
    bits = T.reinterpret("uint32", v)
    odd = (bits >> T.uint32(16)) & T.uint32(1)
    return T.reinterpret("float32", (bits + T.uint32(0x7FFF) + odd) & T.uint32(0xFFFF0000))


def make_split_bf16(cfg: DecodeConfig, width: str):
    B, K = cfg.batch, cfg.model.split_cols(width)

    @T.prim_func(s_tir=True)
    def split_bf16(x: T.Buffer((B, K), "float32"), xs: T.Buffer((2, B, K), "bfloat16")):
        T.func_attr({"tirx.noalias": True})
        for b, k in T.grid(B, K):
            with T.sblock("split"):
                vb, vk = T.axis.remap("SS", [b, k])
                xs[0, vb, vk] = T.Cast("bfloat16", bf16_nearest(x[vb, vk]))
                xs[1, vb, vk] = T.Cast("bfloat16", x[vb, vk] - bf16_nearest(x[vb, vk]))

    return split_bf16
