"""gemv: `y = x @ w.T`, the projections around every mixer (PyTorch `Linear` layout, no bias).

The conv variant (`conv=True`, on a projection whose first `conv_dim` rows are the GDN conv channels: `in_proj_qkv`
or the stacked `in_proj`) also runs causal_conv1d + SiLU on those rows as its epilogue, so a GDN layer needs no
conv launch: each conv channel is one output row, so whoever finishes a row owns that channel's state (no race).
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig, proj: str, conv: bool = False) -> list[Arg]:
    """w: [N, K] float32 (out, in), x: [B, K] float32 -> y: [B, N] float32; (N, K) = projections[proj].
    Conv: also conv_weight: [C, Kc]; state: [S, C, Kc-1] (in place); slots: int32 [B] (-1: the lane's conv rows
    are left untouched, the rest written) before y, whose first C rows are `silu(causal_conv1d(...))`."""
    n, k = cfg.model.projections[proj]
    B, S, C, Kc = cfg.batch, cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel
    head = [Arg("w", (n, k), role="weight"), Arg("x", (B, k))]
    if not conv:
        return [*head, Arg("y", (B, n), role="out")]
    return [
        *head,
        Arg("conv_weight", (C, Kc), role="weight"),
        Arg("state", (S, C, Kc - 1), role="state"),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("y", (B, n), role="out"),
        Arg("state_out", (S, C, Kc - 1), role="state", alias="state"),
    ]


def make_gemv(cfg: DecodeConfig, proj: str, conv: bool = False):
    """Block "gemv" (the reduction over K); conv: it accumulates into a scratch `proj`, then blocks "conv" (y:
    silu of the window . weight on conv rows, `proj` on the rest) and "store" (the window shifted left, the new
    input appended, into state_out) run per (lane, row)."""
    B = cfg.batch
    N, K = cfg.model.projections[proj]
    if not conv:

        @T.prim_func(s_tir=True)
        def gemv(w: T.Buffer((N, K), "float32"), x: T.Buffer((B, K), "float32"), y: T.Buffer((B, N), "float32")):
            T.func_attr({"tirx.noalias": True})
            for b, n, k in T.grid(B, N, K):
                with T.sblock("gemv"):
                    vb, vn, vk = T.axis.remap("SSR", [b, n, k])
                    with T.init():
                        y[vb, vn] = T.float32(0)
                    y[vb, vn] = y[vb, vn] + x[vb, vk] * w[vn, vk]

        return gemv

    S, C, Kc = cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel
    if N < C:
        raise ValueError(f"{proj}: {N} rows hold no {C} conv channels")

    @T.prim_func(s_tir=True)
    def gemv_conv(
        w: T.Buffer((N, K), "float32"),
        x: T.Buffer((B, K), "float32"),
        conv_weight: T.Buffer((C, Kc), "float32"),
        state: T.Buffer((S, C, Kc - 1), "float32"),
        slots: T.Buffer((B,), "int32"),
        y: T.Buffer((B, N), "float32"),
        state_out: T.Buffer((S, C, Kc - 1), "float32"),
    ):
        proj = T.sblock_alloc_buffer((B, N), "float32")
        for b, n, k in T.grid(B, N, K):
            with T.sblock("gemv"):
                vb, vn, vk = T.axis.remap("SSR", [b, n, k])
                with T.init():
                    proj[vb, vn] = T.float32(0)
                proj[vb, vn] = proj[vb, vn] + x[vb, vk] * w[vn, vk]
        for b, n in T.grid(B, N):
            with T.sblock("conv"):
                vb, vn = T.axis.remap("SS", [b, n])
                if vn >= C:
                    y[vb, vn] = proj[vb, vn]
                elif slots[vb] >= 0:
                    y[vb, vn] = _silu(_window_dot(proj[vb, vn], state, conv_weight, T.max(slots[vb], 0), vn, Kc))
        for b, n, j in T.grid(B, N, Kc - 1):
            with T.sblock("store"):
                vb, vn, vj = T.axis.remap("SSS", [b, n, j])
                if vn < C and slots[vb] >= 0:
                    state_out[slots[vb], vn, vj] = T.if_then_else(
                        vj < Kc - 2, state[T.max(slots[vb], 0), T.min(vn, C - 1), T.min(vj + 1, Kc - 2)], proj[vb, vn]
                    )

    return gemv_conv


def _window_dot(x, state, weight, slot, c, taps: int):
    """`state[slot, c, :] . weight[c, :-1] + x * weight[c, -1]` over the `taps`-long window: a TIR expression."""
    acc = x * weight[c, taps - 1]
    for j in range(taps - 1):
        acc = acc + state[slot, c, j] * weight[c, j]
    return acc


def _silu(v):
    return v / (T.float32(1) + T.exp(-v))
