"""gemv: `y = x @ w.T`, the projections around every mixer (PyTorch `Linear` layout, no bias).

The conv variant (`conv=True`, on a projection whose first `conv_dim` rows are the GDN conv channels: `in_proj_qkv`
or the stacked `in_proj`) also runs causal_conv1d + SiLU on those rows as its epilogue, so a GDN layer needs no
conv launch: each conv channel is one output row, so whoever finishes a row owns that channel's state (no race).
The norm variant (`norm=True`, on `out_proj`) takes the delta-rule output and runs gated_rmsnorm on it as its
prologue, so a GDN layer needs no norm launch: every CTA recomputes the head sums it needs (a few KB per lane).
The SwiGLU variant (`swiglu=True`, on `gate_up_proj`: the MLP's gate rows, then its up rows) reduces gate row `n` and
up row `I + n` together and writes only `silu(gate) * up`: the `[B, 2I]` projection never leaves the kernel.
The RMSNorm variant (`rmsnorm=True`, on a projection reading the residual stream: the stacked mixer inputs, gate|up)
takes the stream itself and runs the decoder layer's RMSNorm on it as its prologue, each CTA recomputing its lanes' sums
of squares; the residual variant (`residual=True`, on a projection writing a sublayer's output: out_proj, o_proj,
down_proj) adds its rows into the stream in place, each row's owner adding its own. Together they take the decoder
layer's norm launches out of a step.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.causal_conv1d_silu import shifted_window, silu, window_dot
from gdn_tvm.ops.common import one_plus, rms_normalized, sum_of_squares, widened
from gdn_tvm.ops.gated_rmsnorm import gated_norm
from gdn_tvm.signature import Arg


def signature(
    cfg: DecodeConfig,
    proj: str,
    conv: bool = False,
    norm: bool = False,
    swiglu: bool = False,
    rmsnorm: bool = False,
    residual: bool = False,
) -> list[Arg]:
    """w: [N, K] weight_dtype (out, in), x: [B, K] float32 -> y: [B, N] float32; (N, K) = projections[proj].
    SwiGLU: y: [B, N/2] float32, `y[b, n] = silu(x[b] . w[n]) * (x[b] . w[N/2 + n])`.
    Conv: also conv_weight: [C, Kc] weight_dtype; state: [S, C, Kc-1] (in place); slots: int32 [B] (-1: the lane's
    conv rows are left untouched, the rest written) before y, whose first C rows are `silu(causal_conv1d(...))`.
    Norm: x is the delta-rule output `o` ([B, Hv*Dv], K = Hv*Dv), also z: [B, Hv*Dv] and norm_weight: [Dv]
    weight_dtype; y is `gated_rmsnorm(o, z, norm_weight) @ w.T`.
    RMSNorm: x is the residual stream, also norm_weight: [K] weight_dtype (zero-centred); the GEMV reads
    `rmsnorm(x) * (1 + norm_weight)`. Residual: no y; residual: [B, N] float32, in place: `residual += y`."""
    n, k = cfg.model.projections[proj]
    B, S, C, Kc = cfg.batch, cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel
    W = cfg.weight_dtype
    head = [Arg("w", (n, k), W, role="weight"), Arg("x", (B, k))]
    if norm:
        head += [Arg("z", (B, k)), Arg("norm_weight", (cfg.model.head_v_dim,), W, role="weight")]
    if rmsnorm:
        head += [Arg("norm_weight", (k,), W, role="weight")]
    if residual:
        return [
            *head,
            Arg("residual", (B, n), role="state"),
            Arg("residual_out", (B, n), role="state", alias="residual"),
        ]
    if not conv:
        return [*head, Arg("y", (B, n // 2 if swiglu else n), role="out")]
    return [
        *head,
        Arg("conv_weight", (C, Kc), W, role="weight"),
        Arg("state", (S, C, Kc - 1), role="state"),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("y", (B, n), role="out"),
        Arg("state_out", (S, C, Kc - 1), role="state", alias="state"),
    ]


def make_gemv(
    cfg: DecodeConfig,
    proj: str,
    conv: bool = False,
    norm: bool = False,
    swiglu: bool = False,
    rmsnorm: bool = False,
    residual: bool = False,
):
    """Block "gemv" (the reduction over K) into y, or into a scratch the epilogue reads. Prologues (norm, rmsnorm):
    blocks "sumsq" (per lane and head; rmsnorm: one head of K) and "normed" (the normalised input the GEMV reads)
    come before it. Epilogues: conv: blocks "conv" (y: silu of the window . weight on conv rows, the projection on
    the rest) and "store" (the window shifted left, the new input appended, into state_out) per (lane, row); swiglu:
    "gemv" runs over (lane, row, gate/up) into a scratch `gate_up` [2, B, N/2] (gate sums, then up sums), then block
    "swiglu" writes y per (lane, row) as the product over the pair of `silu(gate)` and `up` (y = 1 * silu(gate) * up,
    the same rounding): every index into `gate_up` a loop variable, as TVM 0.27's `reverse_compute_at` needs (a
    constant one fails its region match); residual: block "residual" adds the scratch into residual_out."""
    if sum((conv, swiglu, residual)) > 1 or (norm and rmsnorm):
        raise ValueError(f"{proj}: one prologue (norm, rmsnorm) and one epilogue (conv, swiglu, residual) at most")
    N, K = cfg.model.projections[proj]
    if norm and K % cfg.model.head_v_dim:
        raise ValueError(f"{K} inputs are not whole heads of {cfg.model.head_v_dim}")
    if swiglu and N % 2:
        raise ValueError(f"{N} rows are no gate and up halves")
    if conv and N < cfg.model.conv_dim:
        raise ValueError(f"{proj}: {N} rows hold no {cfg.model.conv_dim} conv channels")
    variant = "_".join(
        f
        for f, on in (("norm", norm), ("rmsnorm", rmsnorm), ("conv", conv), ("swiglu", swiglu), ("residual", residual))
        if on
    )
    return _VARIANTS[variant](cfg, N, K)


def _plain(cfg: DecodeConfig, N: int, K: int):
    B, W = cfg.batch, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def gemv(w: T.Buffer((N, K), W), x: T.Buffer((B, K), "float32"), y: T.Buffer((B, N), "float32")):
        T.func_attr({"tirx.noalias": True})
        _gemv_rows(w, x, y)

    return gemv


def _rmsnorm(cfg: DecodeConfig, N: int, K: int):
    B, W, eps = cfg.batch, cfg.weight_dtype, cfg.model.rms_norm_eps

    @T.prim_func(s_tir=True)
    def gemv_rmsnorm(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        norm_weight: T.Buffer((K,), W),
        y: T.Buffer((B, N), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        sumsq = T.sblock_alloc_buffer((B,), "float32")
        normed = T.sblock_alloc_buffer((B, K), "float32")
        _rms_prologue(x, norm_weight, sumsq, normed, B, K, eps)
        _gemv_rows(w, normed, y)

    return gemv_rmsnorm


def _residual(cfg: DecodeConfig, N: int, K: int):
    B, W = cfg.batch, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def gemv_residual(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        residual: T.Buffer((B, N), "float32"),
        residual_out: T.Buffer((B, N), "float32"),
    ):
        proj = T.sblock_alloc_buffer((B, N), "float32")
        _gemv_rows(w, x, proj)
        _residual_epilogue(proj, residual, residual_out, B, N)

    return gemv_residual


def _conv(cfg: DecodeConfig, N: int, K: int):
    B, S, C, Kc, W = cfg.batch, cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def gemv_conv(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        conv_weight: T.Buffer((C, Kc), W),
        state: T.Buffer((S, C, Kc - 1), "float32"),
        slots: T.Buffer((B,), "int32"),
        y: T.Buffer((B, N), "float32"),
        state_out: T.Buffer((S, C, Kc - 1), "float32"),
    ):
        proj = T.sblock_alloc_buffer((B, N), "float32")
        _gemv_rows(w, x, proj)
        _conv_epilogue(proj, conv_weight, state, slots, y, state_out, B, N, C, Kc)

    return gemv_conv


def _rmsnorm_conv(cfg: DecodeConfig, N: int, K: int):
    B, S, C, Kc, W = cfg.batch, cfg.slots, cfg.model.conv_dim, cfg.model.conv_kernel, cfg.weight_dtype
    eps = cfg.model.rms_norm_eps

    @T.prim_func(s_tir=True)
    def gemv_rmsnorm_conv(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        norm_weight: T.Buffer((K,), W),
        conv_weight: T.Buffer((C, Kc), W),
        state: T.Buffer((S, C, Kc - 1), "float32"),
        slots: T.Buffer((B,), "int32"),
        y: T.Buffer((B, N), "float32"),
        state_out: T.Buffer((S, C, Kc - 1), "float32"),
    ):
        sumsq = T.sblock_alloc_buffer((B,), "float32")
        normed = T.sblock_alloc_buffer((B, K), "float32")
        proj = T.sblock_alloc_buffer((B, N), "float32")
        _rms_prologue(x, norm_weight, sumsq, normed, B, K, eps)
        _gemv_rows(w, normed, proj)
        _conv_epilogue(proj, conv_weight, state, slots, y, state_out, B, N, C, Kc)

    return gemv_rmsnorm_conv


def _norm(cfg: DecodeConfig, N: int, K: int):
    B, Dv, eps, W = cfg.batch, cfg.model.head_v_dim, cfg.model.rms_norm_eps, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def gemv_norm(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        z: T.Buffer((B, K), "float32"),
        norm_weight: T.Buffer((Dv,), W),
        y: T.Buffer((B, N), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        sumsq = T.sblock_alloc_buffer((B, K // Dv), "float32")
        normed = T.sblock_alloc_buffer((B, K), "float32")
        _gated_prologue(x, z, norm_weight, sumsq, normed, B, K, Dv, eps)
        _gemv_rows(w, normed, y)

    return gemv_norm


def _norm_residual(cfg: DecodeConfig, N: int, K: int):
    B, Dv, eps, W = cfg.batch, cfg.model.head_v_dim, cfg.model.rms_norm_eps, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def gemv_norm_residual(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        z: T.Buffer((B, K), "float32"),
        norm_weight: T.Buffer((Dv,), W),
        residual: T.Buffer((B, N), "float32"),
        residual_out: T.Buffer((B, N), "float32"),
    ):
        sumsq = T.sblock_alloc_buffer((B, K // Dv), "float32")
        normed = T.sblock_alloc_buffer((B, K), "float32")
        proj = T.sblock_alloc_buffer((B, N), "float32")
        _gated_prologue(x, z, norm_weight, sumsq, normed, B, K, Dv, eps)
        _gemv_rows(w, normed, proj)
        _residual_epilogue(proj, residual, residual_out, B, N)

    return gemv_norm_residual


def _swiglu(cfg: DecodeConfig, N: int, K: int):
    B, W = cfg.batch, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def gemv_swiglu(w: T.Buffer((N, K), W), x: T.Buffer((B, K), "float32"), y: T.Buffer((B, N // 2), "float32")):
        T.func_attr({"tirx.noalias": True})
        gate_up = T.sblock_alloc_buffer((2, B, N // 2), "float32")
        _swiglu_rows(w, x, gate_up, y, B, N // 2, K)

    return gemv_swiglu


def _rmsnorm_swiglu(cfg: DecodeConfig, N: int, K: int):
    B, W, eps = cfg.batch, cfg.weight_dtype, cfg.model.rms_norm_eps

    @T.prim_func(s_tir=True)
    def gemv_rmsnorm_swiglu(
        w: T.Buffer((N, K), W),
        x: T.Buffer((B, K), "float32"),
        norm_weight: T.Buffer((K,), W),
        y: T.Buffer((B, N // 2), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        sumsq = T.sblock_alloc_buffer((B,), "float32")
        normed = T.sblock_alloc_buffer((B, K), "float32")
        gate_up = T.sblock_alloc_buffer((2, B, N // 2), "float32")
        _rms_prologue(x, norm_weight, sumsq, normed, B, K, eps)
        _swiglu_rows(w, normed, gate_up, y, B, N // 2, K)

    return gemv_rmsnorm_swiglu


_VARIANTS = {
    "": _plain,
    "rmsnorm": _rmsnorm,
    "residual": _residual,
    "conv": _conv,
    "rmsnorm_conv": _rmsnorm_conv,
    "norm": _norm,
    "norm_residual": _norm_residual,
    "swiglu": _swiglu,
    "rmsnorm_swiglu": _rmsnorm_swiglu,
}


def _gemv_rows(w, x, y) -> None:
    """Block "gemv", expanded in the calling prim_func body (a fresh macro: see `gdn_tvm.ops.common`):
    `y[b, n] = sum_k x[b, k] * w[n, k]`; w: [N, K] (its stored dtype, read as float32), x: [B, K], y: [B, N]
    (parameters or scratch buffers)."""

    @T.macro
    def block():
        for b, n, k in T.grid(x.shape[0], w.shape[0], w.shape[1]):
            with T.sblock("gemv"):
                vb, vn, vk = T.axis.remap("SSR", [b, n, k])
                with T.init():
                    y[vb, vn] = T.float32(0)
                y[vb, vn] = y[vb, vn] + x[vb, vk] * widened(w[vn, vk])

    block()


def _swiglu_rows(w, x, gate_up, y, B: int, half: int, K: int) -> None:
    """Blocks "gemv" (gate row `n` and up row `half + n` over (lane, row, gate/up) into `gate_up` [2, B, half]) and
    "swiglu" (y [B, half]: silu(gate) * up as a product over the pair; see `make_gemv`)."""

    @T.macro
    def blocks():
        for b, n, j, k in T.grid(B, half, 2, K):
            with T.sblock("gemv"):
                vb, vn, vj, vk = T.axis.remap("SSSR", [b, n, j, k])
                with T.init():
                    gate_up[vj, vb, vn] = T.float32(0)
                gate_up[vj, vb, vn] = gate_up[vj, vb, vn] + x[vb, vk] * widened(w[vj * half + vn, vk])
        for b, n, j in T.grid(B, half, 2):
            with T.sblock("swiglu"):
                vb, vn, vj = T.axis.remap("SSR", [b, n, j])
                with T.init():
                    y[vb, vn] = T.float32(1)
                y[vb, vn] = y[vb, vn] * T.if_then_else(vj == 0, silu(gate_up[vj, vb, vn]), gate_up[vj, vb, vn])

    blocks()


def _rms_prologue(x, weight, sumsq, normed, B: int, K: int, eps: float) -> None:
    """Blocks "sumsq" (per lane, over K) and "normed" (`x * rsqrt(mean(x^2) + eps) * (1 + weight)`, as the
    `rmsnorm` op rounds it) of x [B, K] into `normed` [B, K]."""
    sum_of_squares("sumsq", (B, K), lambda b, k: x[b, k], sumsq)

    @T.macro
    def block():
        for b, k in T.grid(B, K):
            with T.sblock("normed"):
                vb, vk = T.axis.remap("SS", [b, k])
                normed[vb, vk] = rms_normalized(x[vb, vk], sumsq[vb], K, eps, one_plus(weight[vk]))

    block()


def _gated_prologue(x, z, weight, sumsq, normed, B: int, K: int, Dv: int, eps: float) -> None:
    """Blocks "sumsq" (per lane and head of Dv) and "normed" (`gated_rmsnorm` of x by z) of x [B, K] into `normed`."""
    sum_of_squares("sumsq", (B, K // Dv, Dv), lambda b, h, d: x[b, h * Dv + d], sumsq)

    @T.macro
    def block():
        for b, k in T.grid(B, K):
            with T.sblock("normed"):
                vb, vk = T.axis.remap("SS", [b, k])
                normed[vb, vk] = gated_norm(
                    x[vb, vk], sumsq[vb, vk // Dv], widened(weight[vk % Dv]), z[vb, vk], Dv, eps
                )

    block()


def _conv_epilogue(proj, conv_weight, state, slots, y, state_out, B: int, N: int, C: int, Kc: int) -> None:
    """Blocks "conv" (y per (lane, row): silu of the conv on the first C rows of `proj`, the projection on the rest)
    and "store" (each conv row's window shifted, into state_out) for lanes whose slot is not -1."""

    @T.macro
    def blocks():
        for b, n in T.grid(B, N):
            with T.sblock("conv"):
                vb, vn = T.axis.remap("SS", [b, n])
                if vn >= C:
                    y[vb, vn] = proj[vb, vn]
                elif slots[vb] >= 0:
                    y[vb, vn] = silu(window_dot(proj[vb, vn], state, conv_weight, T.max(slots[vb], 0), vn, Kc))
        for b, n, j in T.grid(B, N, Kc - 1):
            with T.sblock("store"):
                vb, vn, vj = T.axis.remap("SSS", [b, n, j])
                if vn < C and slots[vb] >= 0:
                    state_out[slots[vb], vn, vj] = shifted_window(
                        state, proj[vb, vn], T.max(slots[vb], 0), T.min(vn, C - 1), vj, Kc
                    )

    blocks()


def _residual_epilogue(proj, residual, residual_out, B: int, N: int) -> None:
    """Block "residual": `residual_out[b, n] = residual[b, n] + proj[b, n]` (the stream updated in place)."""

    @T.macro
    def block():
        for b, n in T.grid(B, N):
            with T.sblock("residual"):
                vb, vn = T.axis.remap("SS", [b, n])
                residual_out[vb, vn] = residual[vb, vn] + proj[vb, vn]

    block()
