"""split_interleaved: the q projection's per-head `[q | gate]` rows split into two buffers (pure data movement)."""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """src: [B, Hq, 2*D] float32 (per head `[q | gate]`) -> q, gate: [B, Hq, D] float32."""
    B, H, D = cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim
    return [Arg("src", (B, H, 2 * D)), Arg("q", (B, H, D), role="out"), Arg("gate", (B, H, D), role="out")]


def make_split_interleaved(cfg: DecodeConfig):
    B, H, D = cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim

    @T.prim_func(s_tir=True)
    def split_interleaved(
        src: T.Buffer((B, H, 2 * D), "float32"), q: T.Buffer((B, H, D), "float32"), gate: T.Buffer((B, H, D), "float32")
    ):
        T.func_attr({"tirx.noalias": True})
        for b, h, d in T.grid(B, H, D):
            with T.sblock("split"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                q[vb, vh, vd] = src[vb, vh, vd]
                gate[vb, vh, vd] = src[vb, vh, D + vd]

    return split_interleaved
