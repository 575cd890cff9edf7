"""causal_conv1d_silu: depthwise causal conv over the last Kc inputs of each channel, then silu.

The conv state pool keeps, per slot and channel, the previous Kc-1 inputs (oldest first). One decode
step reads that window plus the new input, writes `silu(window . weight)` and shifts the window left.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import widened
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """x: [B, C]; weight: [C, Kc] weight_dtype; state: [S, C, Kc-1] (in place); slots: int32 [B] (-1 skips a lane)
    -> y: [B, C]; float32 but the weight."""
    B, S, C, K = cfg.batch, cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel
    return [
        Arg("x", (B, C)),
        Arg("weight", (C, K), cfg.weight_dtype, role="weight"),
        Arg("state", (S, C, K - 1), role="state"),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("y", (B, C), role="out"),
        Arg("state_out", (S, C, K - 1), role="state", alias="state"),
    ]


def make_causal_conv1d_silu(cfg: DecodeConfig):
    """Blocks: "dot" (window . weight into an accumulator), "conv" (y = silu of it), "shift" (the window
    shifted left, x appended, into a scratch row) and "store" (scratch -> state_out). Lanes with slot -1
    write nothing (their state reads go to slot 0 and are discarded)."""
    B, S, C, K = cfg.batch, cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel
    W = cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def causal_conv1d_silu(
        x: T.Buffer((B, C), "float32"),
        weight: T.Buffer((C, K), W),
        state: T.Buffer((S, C, K - 1), "float32"),
        slots: T.Buffer((B,), "int32"),
        y: T.Buffer((B, C), "float32"),
        state_out: T.Buffer((S, C, K - 1), "float32"),
    ):
        acc = T.sblock_alloc_buffer((B, C), "float32")
        shifted = T.sblock_alloc_buffer((B, C, K - 1), "float32")
        for b, c, j in T.grid(B, C, K - 1):
            with T.sblock("dot"):
                vb, vc, vj = T.axis.remap("SSR", [b, c, j])
                with T.init():
                    acc[vb, vc] = newest_tap(x[vb, vc], weight, vc, K)
                acc[vb, vc] = acc[vb, vc] + window_tap(state, weight, T.max(slots[vb], 0), vc, vj)
        for b, c in T.grid(B, C):
            with T.sblock("conv"):
                vb, vc = T.axis.remap("SS", [b, c])
                if slots[vb] >= 0:
                    y[vb, vc] = silu(acc[vb, vc])
        for b, c, j in T.grid(B, C, K - 1):
            with T.sblock("shift"):
                vb, vc, vj = T.axis.remap("SSS", [b, c, j])
                shifted[vb, vc, vj] = shifted_window(state, x[vb, vc], T.max(slots[vb], 0), vc, vj, K)
        for b, c, j in T.grid(B, C, K - 1):
            with T.sblock("store"):
                vb, vc, vj = T.axis.remap("SSS", [b, c, j])
                if slots[vb] >= 0:
                    state_out[slots[vb], vc, vj] = shifted[vb, vc, vj]

    return causal_conv1d_silu


def silu(v):
    """`v * sigmoid(v)`, as `v / (1 + exp(-v))`: a TIR expression."""
    return v / (T.float32(1) + T.exp(-v))


def newest_tap(x, weight, c, taps: int):
    """`x * weight[c, -1]`: the new input's term of the window dot product (the last tap): a TIR expression."""
    return x * widened(weight[c, taps - 1])


def window_tap(state, weight, slot, c, j):
    """`state[slot, c, j] * weight[c, j]`: the term of stored input `j` (oldest first): a TIR expression."""
    return state[slot, c, j] * widened(weight[c, j])


def window_dot(x, state, weight, slot, c, taps: int):
    """The whole window dot product unrolled, the new input's term first then the stored ones in order (the "dot"
    block's init and updates as one expression): a TIR expression."""
    acc = newest_tap(x, weight, c, taps)
    for j in range(taps - 1):
        acc = acc + window_tap(state, weight, slot, c, j)
    return acc


def shifted_window(state, x, slot, c, j, taps: int):
    """Element `j` of channel `c`'s window shifted left with the new input `x` appended: `state[slot, c, j + 1]`,
    or `x` at the last element (the clamped index keeps the load in bounds): a TIR expression."""
    return T.if_then_else(j < taps - 2, state[slot, c, T.min(j + 1, taps - 2)], x)
