"""add_rmsnorm: the decoder layer's residual add and RMSNorm in one kernel; `add=False` is the plain RMSNorm (the
model's final norm).

`residual += x; y = residual * rsqrt(mean(residual^2) + eps) * (1 + w)` per lane, with `w` the checkpoint's
zero-centred weight as stored (`input_layernorm`, `post_attention_layernorm` and the final `norm`, in `weight_dtype`;
the 1 added in float32 here, as Hugging Face does). The residual is updated in place (its write side is
`residual_out`).
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import one_plus, rms_normalized, sum_of_squares
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig, add: bool = True) -> list[Arg]:
    """x: [B, hidden]; residual: [B, hidden] (in place, with `add`); weight: [hidden] (zero-centred, weight_dtype)
    -> y: [B, hidden]; float32 but the weight."""
    B, H, W = cfg.batch, cfg.model.hidden, cfg.weight_dtype
    if not add:
        return [Arg("x", (B, H)), Arg("weight", (H,), W, role="weight"), Arg("y", (B, H), role="out")]
    return [
        Arg("x", (B, H)),
        Arg("residual", (B, H), role="state"),
        Arg("weight", (H,), W, role="weight"),
        Arg("y", (B, H), role="out"),
        Arg("residual_out", (B, H), role="state", alias="residual"),
    ]


def make_add_rmsnorm(cfg: DecodeConfig, add: bool = True):
    """Blocks: "add" (`x + residual` into a scratch row, with `add`), "sumsq" (its sum of squares per lane), "norm"
    (y) and "store" (the scratch row into `residual_out`, with `add`)."""
    B, H, eps, W = cfg.batch, cfg.model.hidden, cfg.model.rms_norm_eps, cfg.weight_dtype
    if add:
        return _add_rmsnorm(B, H, eps, W)
    return _rmsnorm(B, H, eps, W)


def _normalize(B: int, H: int, eps: float):
    """A fresh macro (block names unsuffixed in each function): "sumsq" and "norm" of the rows `h` into `y`."""

    @T.macro
    def normalize(h, weight, y, ss):
        sum_of_squares("sumsq", (B, H), lambda b, i: h[b, i], ss)
        for b, i in T.grid(B, H):
            with T.sblock("norm"):
                vb, vi = T.axis.remap("SS", [b, i])
                y[vb, vi] = rms_normalized(h[vb, vi], ss[vb], H, eps, one_plus(weight[vi]))

    return normalize


def _add_rmsnorm(B: int, H: int, eps: float, W: str):
    normalize = _normalize(B, H, eps)

    @T.prim_func(s_tir=True)
    def add_rmsnorm(
        x: T.Buffer((B, H), "float32"),
        residual: T.Buffer((B, H), "float32"),
        weight: T.Buffer((H,), W),
        y: T.Buffer((B, H), "float32"),
        residual_out: T.Buffer((B, H), "float32"),
    ):
        h = T.sblock_alloc_buffer((B, H), "float32")
        ss = T.sblock_alloc_buffer((B,), "float32")
        for b, i in T.grid(B, H):
            with T.sblock("add"):
                vb, vi = T.axis.remap("SS", [b, i])
                h[vb, vi] = x[vb, vi] + residual[vb, vi]
        normalize(h, weight, y, ss)
        for b, i in T.grid(B, H):
            with T.sblock("store"):
                vb, vi = T.axis.remap("SS", [b, i])
                residual_out[vb, vi] = h[vb, vi]

    return add_rmsnorm


def _rmsnorm(B: int, H: int, eps: float, W: str):
    normalize = _normalize(B, H, eps)

    @T.prim_func(s_tir=True)
    def rmsnorm(x: T.Buffer((B, H), "float32"), weight: T.Buffer((H,), W), y: T.Buffer((B, H), "float32")):
        T.func_attr({"tirx.noalias": True})
        ss = T.sblock_alloc_buffer((B,), "float32")
        normalize(x, weight, y, ss)

    return rmsnorm
