"""gated_rmsnorm: RMS-normalise each value head of the delta-rule output, scale by w, gate by silu(z)."""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import sum_of_squares, widened
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """o, z: [B, Hv, Dv] float32; w: [Dv] weight_dtype -> y: [B, Hv, Dv] float32."""
    shape = (cfg.batch, cfg.model.n_v_heads, cfg.model.head_v_dim)
    w = Arg("w", shape[-1:], cfg.weight_dtype, role="weight")
    return [Arg("o", shape), Arg("z", shape), w, Arg("y", shape, role="out")]


def make_gated_rmsnorm(cfg: DecodeConfig):
    """`y = o * rsqrt(mean(o^2) + eps) * w * silu(z)` per head (w as stored, eps `cfg.model.rms_norm_eps`); blocks
    "sumsq" then "norm"."""
    B, H, D, eps = cfg.batch, cfg.model.n_v_heads, cfg.model.head_v_dim, cfg.model.rms_norm_eps

    @T.prim_func(s_tir=True)
    def gated_rmsnorm(
        o: T.Buffer((B, H, D), "float32"),
        z: T.Buffer((B, H, D), "float32"),
        w: T.Buffer((D,), cfg.weight_dtype),
        y: T.Buffer((B, H, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        sumsq = T.sblock_alloc_buffer((B, H), "float32")
        sum_of_squares("sumsq", (B, H, D), lambda b, h, d: o[b, h, d], sumsq)
        for b, h, d in T.grid(B, H, D):
            with T.sblock("norm"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                y[vb, vh, vd] = gated_norm(o[vb, vh, vd], sumsq[vb, vh], widened(w[vd]), z[vb, vh, vd], D, eps)

    return gated_rmsnorm


def gated_norm(o, sumsq, w, z, dim: int, eps: float):
    """`o * rsqrt(sumsq / dim + eps) * w * silu(z)`, sumsq over the head's `dim` elements: a TIR expression."""
    return o * T.rsqrt(sumsq * T.float32(1 / dim) + T.float32(eps)) * w * z / (T.float32(1) + T.exp(-z))
