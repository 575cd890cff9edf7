"""per_head_rmsnorm: RMSNorm of every q and k head of the full-attention layer, in one kernel.

`y = x * rsqrt(mean(x^2) + eps) * (1 + w)` per head of `D`, with `w` the checkpoint's zero-centred weight as
stored (`weight_dtype`; the 1 added in float32 here, as Hugging Face does): `q_norm` for the `Hq` query heads,
`k_norm` for the `Hkv` key heads.
Blocks iterate a combined head axis of `Hq + Hkv` (query heads first) so q and k share one launch:
"gather" picks the head's input row, "sumsq" reduces it, "norm" scales it into `q_out` or `k_out`.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import one_plus, rms_normalized, sum_of_squares
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """q: [B, Hq, D], k: [B, Hkv, D], q_norm, k_norm: [D] (zero-centred) -> q_out: [B, Hq, D], k_out: [B, Hkv, D];
    float32 but the weights (weight_dtype)."""
    B, Hq, Hkv, D = cfg.batch, cfg.model.n_q_heads, cfg.model.n_kv_heads, cfg.model.head_dim
    return [
        Arg("q", (B, Hq, D)),
        Arg("k", (B, Hkv, D)),
        Arg("q_norm", (D,), cfg.weight_dtype, role="weight"),
        Arg("k_norm", (D,), cfg.weight_dtype, role="weight"),
        Arg("q_out", (B, Hq, D), role="out"),
        Arg("k_out", (B, Hkv, D), role="out"),
    ]


def make_per_head_rmsnorm(cfg: DecodeConfig):
    B, Hq, Hkv, D = cfg.batch, cfg.model.n_q_heads, cfg.model.n_kv_heads, cfg.model.head_dim
    H, eps, W = Hq + Hkv, cfg.model.rms_norm_eps, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def per_head_rmsnorm(
        q: T.Buffer((B, Hq, D), "float32"),
        k: T.Buffer((B, Hkv, D), "float32"),
        q_norm: T.Buffer((D,), W),
        k_norm: T.Buffer((D,), W),
        q_out: T.Buffer((B, Hq, D), "float32"),
        k_out: T.Buffer((B, Hkv, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        x = T.sblock_alloc_buffer((B, H, D), "float32")
        ss = T.sblock_alloc_buffer((B, H), "float32")
        for b, h, d in T.grid(B, H, D):
            with T.sblock("gather"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                x[vb, vh, vd] = T.if_then_else(vh < Hq, q[vb, T.min(vh, Hq - 1), vd], k[vb, T.max(vh - Hq, 0), vd])
        sum_of_squares("sumsq", (B, H, D), lambda b, h, d: x[b, h, d], ss)
        for b, h, d in T.grid(B, H, D):
            with T.sblock("norm"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                if vh < Hq:
                    q_out[vb, vh, vd] = rms_normalized(x[vb, vh, vd], ss[vb, vh], D, eps, one_plus(q_norm[vd]))
                else:
                    k_out[vb, vh - Hq, vd] = rms_normalized(x[vb, vh, vd], ss[vb, vh], D, eps, one_plus(k_norm[vd]))

    return per_head_rmsnorm
