"""swiglu: the SwiGLU MLP's activation of a gate|up projection row, `y = silu(gate) * up`.

Where gate|up is a library GEMM (`gemm_gate_up_proj`) its output row `[gate | up]` comes back whole; the GEMV
(`gemv_gate_up_proj_swiglu`) applies the same activation as its epilogue instead.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.causal_conv1d_silu import silu
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig, proj: str) -> list[Arg]:
    """x: [B, 2I] float32 (gate columns, then up: the output of `proj`, gate_up_proj) -> y: [B, I] float32,
    I = intermediate_size."""
    B, I = cfg.batch, cfg.model.intermediate_size
    return [Arg("x", (B, 2 * I)), Arg("y", (B, I), role="out")]


def make_swiglu(cfg: DecodeConfig, proj: str):
    B, I = cfg.batch, cfg.model.intermediate_size

    @T.prim_func(s_tir=True)
    def swiglu(x: T.Buffer((B, 2 * I), "float32"), y: T.Buffer((B, I), "float32")):
        T.func_attr({"tirx.noalias": True})
        for b, i in T.grid(B, I):
            with T.sblock("swiglu"):
                vb, vi = T.axis.remap("SS", [b, i])
                y[vb, vi] = silu(x[vb, vi]) * x[vb, I + vi]

    return swiglu
