"""per_head_l2_norm: L2-normalise the q and k heads of the conv output row."""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import sum_of_squares
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """qkv: [B, conv_dim] (channels [q | k | v]; v is not read) -> qk: [B, 2*Hk, Dk] float32."""
    m = cfg.model
    return [Arg("qkv", (cfg.batch, m.conv_dim)), Arg("qk", (cfg.batch, 2 * m.n_k_heads, m.head_k_dim), role="out")]


def make_per_head_l2_norm(cfg: DecodeConfig):
    """`qk[b, h] = x * rsqrt(sum(x^2) + eps)`, `x = qkv[b, h*Dk:(h+1)*Dk]`, eps `cfg.model.l2_norm_eps`; blocks
    "sumsq" then "norm"."""
    B, C, H, D = cfg.batch, cfg.model.conv_dim, 2 * cfg.model.n_k_heads, cfg.model.head_k_dim
    eps = cfg.model.l2_norm_eps

    @T.prim_func(s_tir=True)
    def per_head_l2_norm(qkv: T.Buffer((B, C), "float32"), qk: T.Buffer((B, H, D), "float32")):
        T.func_attr({"tirx.noalias": True})
        sumsq = T.sblock_alloc_buffer((B, H), "float32")
        sum_of_squares("sumsq", (B, H, D), lambda b, h, d: qkv[b, h * D + d], sumsq)
        for b, h, d in T.grid(B, H, D):
            with T.sblock("norm"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                qk[vb, vh, vd] = l2_normalized(qkv[vb, vh * D + vd], sumsq[vb, vh], eps)

    return per_head_l2_norm


def l2_normalized(x, sumsq, eps: float):
    """`x * rsqrt(sumsq + eps)`, sumsq over x's head: a TIR expression."""
    return x * T.rsqrt(sumsq + T.float32(eps))
