"""sigmoid_gate: `y = x * sigmoid(gate)` of the attention output, per element."""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """x, gate: [B, Hq, D] float32 -> y: [B, Hq, D] float32."""
    shape = (cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim)
    return [Arg("x", shape), Arg("gate", shape), Arg("y", shape, role="out")]


def gated(x, gate):
    """`x * sigmoid(gate)` as `x / (1 + exp(-gate))`: a TIR expression (also the split-KV reduce's epilogue)."""
    return x / (T.float32(1) + T.exp(-gate))


def make_sigmoid_gate(cfg: DecodeConfig):
    B, H, D = cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim

    @T.prim_func(s_tir=True)
    def sigmoid_gate(
        x: T.Buffer((B, H, D), "float32"), gate: T.Buffer((B, H, D), "float32"), y: T.Buffer((B, H, D), "float32")
    ):
        T.func_attr({"tirx.noalias": True})
        for b, h, d in T.grid(B, H, D):
            with T.sblock("gate"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                y[vb, vh, vd] = gated(x[vb, vh, vd], gate[vb, vh, vd])

    return sigmoid_gate
