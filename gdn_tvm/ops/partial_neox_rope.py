"""partial_neox_rope: NeoX-style rotary embedding of the first `n_rot` dims of every q and k head, in one kernel.

For `i < n_rot/2`, `theta_i = positions[b] * rope_theta^(-2i/n_rot)` (lane `b`'s position, read on the device) and
`(x_i, x_{i+n_rot/2}) <- (x_i cos - x_{i+n_rot/2} sin, x_i sin + x_{i+n_rot/2} cos)`; dims `>= n_rot` are copied.
Block "angle" computes `cos`/`sin` per lane and pair with the angle in float64: float32 (or fast-math)
sin/cos of angles near `2^18` rad are off by far more than the 1e-4 contract. The other blocks iterate a
combined head axis of `Hq + Hkv` (query heads first) so q and k share one launch: "rotate" handles one
pair of a head, "copy" one non-rotated element.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """q: [B, Hq, D], k: [B, Hkv, D] float32, positions: [B] int32
    -> q_out: [B, Hq, D], k_out: [B, Hkv, D] float32."""
    B, Hq, Hkv, D = cfg.batch, cfg.model.n_q_heads, cfg.model.n_kv_heads, cfg.model.head_dim
    return [
        Arg("q", (B, Hq, D)),
        Arg("k", (B, Hkv, D)),
        Arg("positions", (B,), "int32", role="index", bound=(0, cfg.max_len)),
        Arg("q_out", (B, Hq, D), role="out"),
        Arg("k_out", (B, Hkv, D), role="out"),
    ]


def make_partial_neox_rope(cfg: DecodeConfig):
    m = cfg.model
    B, Hq, Hkv, D, n_rot = cfg.batch, m.n_q_heads, m.n_kv_heads, m.head_dim, m.n_rot
    H, half, theta = Hq + Hkv, m.n_rot // 2, m.rope_theta

    @T.prim_func(s_tir=True)
    def partial_neox_rope(
        q: T.Buffer((B, Hq, D), "float32"),
        k: T.Buffer((B, Hkv, D), "float32"),
        positions: T.Buffer((B,), "int32"),
        q_out: T.Buffer((B, Hq, D), "float32"),
        k_out: T.Buffer((B, Hkv, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        cos = T.sblock_alloc_buffer((B, half), "float32")
        sin = T.sblock_alloc_buffer((B, half), "float32")
        angles(positions, cos, sin, B, theta, n_rot)
        for b, h in T.grid(B, H):
            for i in range(half):
                with T.sblock("rotate"):
                    vb, vh, vi = T.axis.remap("SSS", [b, h, i])
                    if vh < Hq:
                        q_out[vb, vh, vi] = q[vb, vh, vi] * cos[vb, vi] - q[vb, vh, vi + half] * sin[vb, vi]
                        q_out[vb, vh, vi + half] = q[vb, vh, vi] * sin[vb, vi] + q[vb, vh, vi + half] * cos[vb, vi]
                    else:
                        k_out[vb, vh - Hq, vi] = (
                            k[vb, vh - Hq, vi] * cos[vb, vi] - k[vb, vh - Hq, vi + half] * sin[vb, vi]
                        )
                        k_out[vb, vh - Hq, vi + half] = (
                            k[vb, vh - Hq, vi] * sin[vb, vi] + k[vb, vh - Hq, vi + half] * cos[vb, vi]
                        )
            for d in range(D - n_rot):
                with T.sblock("copy"):
                    vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                    if vh < Hq:
                        q_out[vb, vh, n_rot + vd] = q[vb, vh, n_rot + vd]
                    else:
                        k_out[vb, vh - Hq, n_rot + vd] = k[vb, vh - Hq, n_rot + vd]

    return partial_neox_rope


def angle(position, i, theta: float, n_rot: int):
    """float64 `position * theta^(-2i/n_rot)` of rotated pair i: a TIR expression."""
    return T.cast(position, "float64") * T.pow(T.float64(theta), T.cast(i, "float64") * T.float64(-2 / n_rot))


def angles(positions, cos, sin, B: int, theta: float, n_rot: int) -> None:
    """Block "angle", expanded in the calling prim_func body: `cos`, `sin` [B, n_rot/2] float32 of each lane's
    rotated pairs, the angle in float64."""

    @T.macro
    def block():
        for b, i in T.grid(B, n_rot // 2):
            with T.sblock("angle"):
                vb, vi = T.axis.remap("SS", [b, i])
                cos[vb, vi] = T.Cast("float32", T.cos(angle(positions[vb], vi, theta, n_rot)))
                sin[vb, vi] = T.Cast("float32", T.sin(angle(positions[vb], vi, theta, n_rot)))

    block()
