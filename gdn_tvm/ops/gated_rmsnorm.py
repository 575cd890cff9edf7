"""gated_rmsnorm: RMS-normalise each value head of the delta-rule output, scale by w, gate by silu(z)."""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg

EPS = 1e-6  # added to the mean of squares (SPEC.md step 7)


def signature(cfg: DecodeConfig) -> list[Arg]:
    """o, z: [B, Hv, Dv]; w: [Dv] -> y: [B, Hv, Dv] float32."""
    shape = (cfg.batch, cfg.model.n_v_heads, cfg.model.head_v_dim)
    return [Arg("o", shape), Arg("z", shape), Arg("w", shape[-1:], role="weight"), Arg("y", shape, role="out")]


def make_gated_rmsnorm(cfg: DecodeConfig):
    """`y = o * rsqrt(mean(o^2) + eps) * w * silu(z)` per head (w as stored); blocks "sumsq" then "norm"."""
    B, H, D = cfg.batch, cfg.model.n_v_heads, cfg.model.head_v_dim

    @T.prim_func(s_tir=True)
    def gated_rmsnorm(
        o: T.Buffer((B, H, D), "float32"),
        z: T.Buffer((B, H, D), "float32"),
        w: T.Buffer((D,), "float32"),
        y: T.Buffer((B, H, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        sumsq = T.sblock_alloc_buffer((B, H), "float32")
        for b, h, d in T.grid(B, H, D):
            with T.sblock("sumsq"):
                vb, vh, vd = T.axis.remap("SSR", [b, h, d])
                with T.init():
                    sumsq[vb, vh] = T.float32(0)
                sumsq[vb, vh] = sumsq[vb, vh] + o[vb, vh, vd] * o[vb, vh, vd]
        for b, h, d in T.grid(B, H, D):
            with T.sblock("norm"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                y[vb, vh, vd] = gated_norm(o[vb, vh, vd], sumsq[vb, vh], w[vd], z[vb, vh, vd], D)

    return gated_rmsnorm


def gated_norm(o, sumsq, w, z, dim: int):
    """`o * rsqrt(sumsq / dim + eps) * w * silu(z)`, sumsq over the head's `dim` elements: a TIR expression."""
    return o * T.rsqrt(sumsq * T.float32(1 / dim) + T.float32(EPS)) * w * z / (T.float32(1) + T.exp(-z))
