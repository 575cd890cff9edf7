"""delta_rule: one step of the gated delta-rule recurrence per value head (docs/math.md step 6), state in place.

Per lane `b` with slot `s = slots[b] >= 0`, value head `h` and key head `kh = cfg.model.key_head(h)`,
with `e = exp(g)`, `q = qk[b, kh]`, `k = qk[b, Hk + kh]` and `v = v[h]` read from the conv output row:
  S = e*S;  d = beta*(v - S @ k);  S = S + outer(d, k);  o = (S @ q) / sqrt(Dk).
Written so the state is read once and written once: for each state row `S_i` (length Dk),
  sk_i = S_i.k, sq_i = S_i.q, kq = k.q, d_i = beta*(v_i - e*sk_i),
  S_i <- e*S_i + d_i*k,  o_i = (e*sq_i + d_i*kq) / sqrt(Dk).
SBlocks, in dataflow order (the interface with the schedules): "qk_head" (q and k of the head), "decay" (e),
"state_load" (the old state), "kq", "sk", "sq" (the dot products), "delta" (d), "update" (writes state_out)
and "o". A skipped lane (slot -1) reads and writes no state and leaves `o[b]` untouched. The state is stored in
`cfg.state_dtype`: a bf16 state is widened as it is loaded and the updated row rounded to nearest even as it is
stored; `o` is computed from the updated row before that rounding.

The fused variant (`delta_rule_fused`) also does the two steps before it in the same kernel, so a GDN layer
launches one kernel where it launched three: per-head L2 norm of q and k (blocks "qk_raw", "qk_sumsq", then
"qk_head" scales by `rsqrt(sum + eps)`, eps `cfg.model.l2_norm_eps`) and the gates ("decay" takes
`e = exp(A * softplus(a + dt_bias))`, "beta" `sigmoid(b)`). Every CTA of a head recomputes them: Dk-long sums and
two scalars.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import narrowed, sum_of_squares, widened
from gdn_tvm.ops.gates import log_decay, sample_negative, sample_wide, write_strength
from gdn_tvm.ops.per_head_l2_norm import l2_normalized
from gdn_tvm.signature import Arg


def _unit_rows(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """L2-normalised rows along the last axis, like the output of per_head_l2_norm."""
    x = rng.standard_normal(shape)
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _log_decay(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """`g <= 0`."""
    return (-rng.exponential(0.5, shape)).astype(np.float32)


def _unit_interval(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """`beta` in (0, 1)."""
    return rng.uniform(0.01, 0.99, shape).astype(np.float32)


def signature(cfg: DecodeConfig, fused: bool = False) -> list[Arg]:
    """qk: [B, 2*Hk, Dk] (unit q heads then k heads); qkv: [B, conv_dim] (v[h] at 2*Hk*Dk + h*Dv);
    g, beta: [B, Hv]; state: [S, Hv, Dv, Dk] state_dtype (in place); slots: [B] int32 -> o: [B, Hv, Dv].
    Fused: qkv (q, k and v heads, q and k not yet normalised); a, b: [B, Hv]; A, dt_bias: [Hv]; state; slots -> o."""
    m = cfg.model
    B, S, Hk, Hv, Dk, Dv = cfg.batch, cfg.slots, m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim
    pool = (S, Hv, Dv, Dk)
    if fused:
        inputs = [
            Arg("qkv", (B, m.conv_dim)),
            Arg("a", (B, Hv), sample=sample_wide),
            Arg("b", (B, Hv)),
            Arg("A", (Hv,), role="weight", sample=sample_negative),
            Arg("dt_bias", (Hv,), role="weight"),
        ]
    else:
        inputs = [
            Arg("qk", (B, 2 * Hk, Dk), sample=_unit_rows),
            Arg("qkv", (B, m.conv_dim)),
            Arg("g", (B, Hv), sample=_log_decay),
            Arg("beta", (B, Hv), sample=_unit_interval),
        ]
    return [
        *inputs,
        Arg("state", pool, cfg.state_dtype, role="state"),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("o", (B, Hv, Dv), role="out"),
        Arg("state_out", pool, cfg.state_dtype, role="state", alias="state"),
    ]


def make_delta_rule(cfg: DecodeConfig, fused: bool = False):
    """The recurrence for `cfg.model.head_mapping` ("grouped": kh = h // (Hv/Hk), "tiled": kh = h % Hk);
    `fused`: with the per-head L2 norm of q and k and the gates before it."""
    m = cfg.model
    B, S, Hk, Hv, Dk, Dv, C = cfg.batch, cfg.slots, m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim, m.conv_dim
    group = Hv // Hk if m.head_mapping == "grouped" else 1  # kh = (h // group) % Hk
    v_off = 2 * Hk * Dk
    scale, l2_eps, SD = float(Dk) ** -0.5, m.l2_norm_eps, cfg.state_dtype

    @T.macro
    def recurrence(qkh, e, beta, qkv, state, slots, o, state_out):
        """Everything from the state load on: qkh [B, Hv, 2, Dk] (unit q, k of each value head), e and beta [B, Hv]."""
        s_old = T.sblock_alloc_buffer((B, Hv, Dv, Dk), "float32")
        kq = T.sblock_alloc_buffer((B, Hv), "float32")
        sk = T.sblock_alloc_buffer((B, Hv, Dv), "float32")
        sq = T.sblock_alloc_buffer((B, Hv, Dv), "float32")
        d = T.sblock_alloc_buffer((B, Hv, Dv), "float32")
        for b, h, i, j in T.grid(B, Hv, Dv, Dk):
            with T.sblock("state_load"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                s_old[vb, vh, vi, vj] = T.if_then_else(
                    slots[vb] >= 0, widened(state[T.max(slots[vb], 0), vh, vi, vj]), T.float32(0)
                )
        for b, h, j in T.grid(B, Hv, Dk):
            with T.sblock("kq"):
                vb, vh, vj = T.axis.remap("SSR", [b, h, j])
                with T.init():
                    kq[vb, vh] = T.float32(0)
                kq[vb, vh] = kq[vb, vh] + qkh[vb, vh, 0, vj] * qkh[vb, vh, 1, vj]
        for b, h, i, j in T.grid(B, Hv, Dv, Dk):
            with T.sblock("sk"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    sk[vb, vh, vi] = T.float32(0)
                sk[vb, vh, vi] = sk[vb, vh, vi] + s_old[vb, vh, vi, vj] * qkh[vb, vh, 1, vj]
        for b, h, i, j in T.grid(B, Hv, Dv, Dk):
            with T.sblock("sq"):
                vb, vh, vi, vj = T.axis.remap("SSSR", [b, h, i, j])
                with T.init():
                    sq[vb, vh, vi] = T.float32(0)
                sq[vb, vh, vi] = sq[vb, vh, vi] + s_old[vb, vh, vi, vj] * qkh[vb, vh, 0, vj]
        for b, h, i in T.grid(B, Hv, Dv):
            with T.sblock("delta"):
                vb, vh, vi = T.axis.remap("SSS", [b, h, i])
                d[vb, vh, vi] = beta[vb, vh] * (qkv[vb, v_off + vh * Dv + vi] - e[vb, vh] * sk[vb, vh, vi])
        for b, h, i, j in T.grid(B, Hv, Dv, Dk):
            with T.sblock("update"):
                vb, vh, vi, vj = T.axis.remap("SSSS", [b, h, i, j])
                if slots[vb] >= 0:
                    state_out[slots[vb], vh, vi, vj] = narrowed(
                        e[vb, vh] * s_old[vb, vh, vi, vj] + d[vb, vh, vi] * qkh[vb, vh, 1, vj], SD
                    )
        for b, h, i in T.grid(B, Hv, Dv):
            with T.sblock("o"):
                vb, vh, vi = T.axis.remap("SSS", [b, h, i])
                if slots[vb] >= 0:
                    o[vb, vh, vi] = (e[vb, vh] * sq[vb, vh, vi] + d[vb, vh, vi] * kq[vb, vh]) * T.float32(scale)

    if fused:  # one variant parsed: a macro expanded twice gets renamed blocks

        @T.prim_func(s_tir=True)
        def delta_rule_fused(
            qkv: T.Buffer((B, C), "float32"),
            a: T.Buffer((B, Hv), "float32"),
            b: T.Buffer((B, Hv), "float32"),
            A: T.Buffer((Hv,), "float32"),
            dt_bias: T.Buffer((Hv,), "float32"),
            state: T.Buffer((S, Hv, Dv, Dk), SD),
            slots: T.Buffer((B,), "int32"),
            o: T.Buffer((B, Hv, Dv), "float32"),
            state_out: T.Buffer((S, Hv, Dv, Dk), SD),
        ):
            raw = T.sblock_alloc_buffer((B, Hv, 2, Dk), "float32")
            sumsq = T.sblock_alloc_buffer((B, Hv, 2), "float32")
            qkh = T.sblock_alloc_buffer((B, Hv, 2, Dk), "float32")
            e = T.sblock_alloc_buffer((B, Hv), "float32")
            beta = T.sblock_alloc_buffer((B, Hv), "float32")
            for n, h, t, j in T.grid(B, Hv, 2, Dk):
                with T.sblock("qk_raw"):
                    vb, vh, vt, vj = T.axis.remap("SSSS", [n, h, t, j])
                    raw[vb, vh, vt, vj] = qkv[vb, (vt * Hk + vh // group % Hk) * Dk + vj]
            sum_of_squares("qk_sumsq", (B, Hv, 2, Dk), lambda n, h, t, j: raw[n, h, t, j], sumsq)
            for n, h, t, j in T.grid(B, Hv, 2, Dk):
                with T.sblock("qk_head"):
                    vb, vh, vt, vj = T.axis.remap("SSSS", [n, h, t, j])
                    qkh[vb, vh, vt, vj] = l2_normalized(raw[vb, vh, vt, vj], sumsq[vb, vh, vt], l2_eps)
            for n, h in T.grid(B, Hv):
                with T.sblock("decay"):
                    vb, vh = T.axis.remap("SS", [n, h])
                    e[vb, vh] = T.exp(log_decay(a[vb, vh], dt_bias[vh], A[vh]))
            for n, h in T.grid(B, Hv):
                with T.sblock("beta"):
                    vb, vh = T.axis.remap("SS", [n, h])
                    beta[vb, vh] = write_strength(b[vb, vh])
            recurrence(qkh, e, beta, qkv, state, slots, o, state_out)

        return delta_rule_fused

    @T.prim_func(s_tir=True)
    def delta_rule(
        qk: T.Buffer((B, 2 * Hk, Dk), "float32"),
        qkv: T.Buffer((B, C), "float32"),
        g: T.Buffer((B, Hv), "float32"),
        beta: T.Buffer((B, Hv), "float32"),
        state: T.Buffer((S, Hv, Dv, Dk), SD),
        slots: T.Buffer((B,), "int32"),
        o: T.Buffer((B, Hv, Dv), "float32"),
        state_out: T.Buffer((S, Hv, Dv, Dk), SD),
    ):
        qkh = T.sblock_alloc_buffer((B, Hv, 2, Dk), "float32")
        e = T.sblock_alloc_buffer((B, Hv), "float32")
        for b, h, t, j in T.grid(B, Hv, 2, Dk):
            with T.sblock("qk_head"):
                vb, vh, vt, vj = T.axis.remap("SSSS", [b, h, t, j])
                qkh[vb, vh, vt, vj] = qk[vb, vt * Hk + vh // group % Hk, vj]
        for b, h in T.grid(B, Hv):
            with T.sblock("decay"):
                vb, vh = T.axis.remap("SS", [b, h])
                e[vb, vh] = T.exp(g[vb, vh])
        recurrence(qkh, e, beta, qkv, state, slots, o, state_out)

    return delta_rule
