"""attention_prologue: what the gated-attention layer does between its input projection and the attention itself,
in one kernel: the q/gate split, the q and k RMSNorms, NeoX RoPE and the KV row scatter.

Per lane and head (a combined head axis of `Hq + Hkv`, query heads first): "sumsq" and "norm" are
`per_head_rmsnorm`'s (q read from the first half of its `[q | gate]` row), "rotate" and "copy" are
`partial_neox_rope`'s on the normalised head (its angles from block "angle", in float64), writing q into `q_out`
and k into its cache row; block "pass" copies the gate half of a query head to `gate` and a key head's v row into
its cache row. A lane with slot -1 writes no cache row. The roundings are those of the four kernels it replaces
(split_interleaved, per_head_rmsnorm, partial_neox_rope, kv_row_scatter): the normalised head in float32, the cache
rows in kv_dtype.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import narrowed, one_plus, rms_normalized
from gdn_tvm.ops.partial_neox_rope import angles
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """q_gate: [B, Hq, 2D] (per head `[q | gate]`), k, v: [B, Hkv, D] float32; q_norm, k_norm: [D] (zero-centred,
    weight_dtype); k_cache, v_cache: [S, max_len, Hkv, D] kv_dtype (row `(slots[b], positions[b])` written);
    slots: [B] int32 (-1 skips the lane's rows); positions: [B] int32 -> q_out, gate: [B, Hq, D] float32."""
    B, S, L = cfg.batch, cfg.slots, cfg.max_len
    Hq, Hkv, D, W = cfg.model.n_q_heads, cfg.model.n_kv_heads, cfg.model.head_dim, cfg.weight_dtype
    return [
        Arg("q_gate", (B, Hq, 2 * D)),
        Arg("k", (B, Hkv, D)),
        Arg("v", (B, Hkv, D)),
        Arg("q_norm", (D,), W, role="weight"),
        Arg("k_norm", (D,), W, role="weight"),
        Arg("k_cache", (S, L, Hkv, D), cfg.kv_dtype, role="state"),
        Arg("v_cache", (S, L, Hkv, D), cfg.kv_dtype, role="state"),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("positions", (B,), "int32", role="index", bound=(0, L)),
        Arg("q_out", (B, Hq, D), role="out"),
        Arg("gate", (B, Hq, D), role="out"),
    ]


def make_attention_prologue(cfg: DecodeConfig):
    """Blocks "angle" (per lane and rotated pair), then per lane and head "sumsq", "norm" (into a scratch `normed`),
    "rotate" (per pair), "copy" (the dims past n_rot) and "pass" (the gate or v row)."""
    m = cfg.model
    B, S, L = cfg.batch, cfg.slots, cfg.max_len
    Hq, Hkv, D, n_rot, eps = m.n_q_heads, m.n_kv_heads, m.head_dim, m.n_rot, m.rms_norm_eps
    H, half, theta, W, KV = Hq + Hkv, m.n_rot // 2, m.rope_theta, cfg.weight_dtype, cfg.kv_dtype
    cache = tuple(T.int64(n) for n in (S, L, Hkv, D))  # int64 indexing: S * max_len * Hkv * D may exceed 2^31

    def head(q_gate, k, b, h, d):
        """Element d of lane b's head h on the combined axis (q from the first half of its row)."""
        return T.if_then_else(h < Hq, q_gate[b, T.min(h, Hq - 1), d], k[b, T.max(h - Hq, 0), d])

    @T.prim_func(s_tir=True)
    def attention_prologue(
        q_gate: T.Buffer((B, Hq, 2 * D), "float32"),
        k: T.Buffer((B, Hkv, D), "float32"),
        v: T.Buffer((B, Hkv, D), "float32"),
        q_norm: T.Buffer((D,), W),
        k_norm: T.Buffer((D,), W),
        k_cache: T.Buffer(cache, KV),
        v_cache: T.Buffer(cache, KV),
        slots: T.Buffer((B,), "int32"),
        positions: T.Buffer((B,), "int32"),
        q_out: T.Buffer((B, Hq, D), "float32"),
        gate: T.Buffer((B, Hq, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        cos = T.sblock_alloc_buffer((B, half), "float32")
        sin = T.sblock_alloc_buffer((B, half), "float32")
        ss = T.sblock_alloc_buffer((B, H), "float32")
        normed = T.sblock_alloc_buffer((B, H, D), "float32")
        angles(positions, cos, sin, B, theta, n_rot)
        for b, h in T.grid(B, H):
            for d in range(D):
                with T.sblock("sumsq"):
                    vb, vh, vd = T.axis.remap("SSR", [b, h, d])
                    with T.init():
                        ss[vb, vh] = T.float32(0)
                    ss[vb, vh] = ss[vb, vh] + head(q_gate, k, vb, vh, vd) * head(q_gate, k, vb, vh, vd)
            for d in range(D):
                with T.sblock("norm"):
                    vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                    normed[vb, vh, vd] = rms_normalized(
                        head(q_gate, k, vb, vh, vd),
                        ss[vb, vh],
                        D,
                        eps,
                        T.if_then_else(vh < Hq, one_plus(q_norm[vd]), one_plus(k_norm[vd])),
                    )
            for i in range(half):
                with T.sblock("rotate"):
                    vb, vh, vi = T.axis.remap("SSS", [b, h, i])
                    if vh < Hq:
                        q_out[vb, vh, vi] = rotated(normed, cos, sin, vb, vh, vi, half, False)
                        q_out[vb, vh, vi + half] = rotated(normed, cos, sin, vb, vh, vi, half, True)
                    elif slots[vb] >= 0:
                        k_cache[slots[vb], positions[vb], vh - Hq, vi] = narrowed(
                            rotated(normed, cos, sin, vb, vh, vi, half, False), KV
                        )
                        k_cache[slots[vb], positions[vb], vh - Hq, vi + half] = narrowed(
                            rotated(normed, cos, sin, vb, vh, vi, half, True), KV
                        )
            for d in range(D - n_rot):
                with T.sblock("copy"):
                    vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                    if vh < Hq:
                        q_out[vb, vh, n_rot + vd] = normed[vb, vh, n_rot + vd]
                    elif slots[vb] >= 0:
                        k_cache[slots[vb], positions[vb], vh - Hq, n_rot + vd] = narrowed(
                            normed[vb, vh, n_rot + vd], KV
                        )
            for d in range(D):
                with T.sblock("pass"):
                    vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                    if vh < Hq:
                        gate[vb, vh, vd] = q_gate[vb, vh, D + vd]
                    elif slots[vb] >= 0:
                        v_cache[slots[vb], positions[vb], vh - Hq, vd] = narrowed(v[vb, vh - Hq, vd], KV)

    return attention_prologue


def rotated(x, cos, sin, b, h, i, half: int, second: bool):
    """Element i (`second`: i + half) of head h of `x` [B, H, D] after the NeoX rotation of pair i: a TIR expression."""
    if second:
        return x[b, h, i] * sin[b, i] + x[b, h, i + half] * cos[b, i]
    return x[b, h, i] * cos[b, i] - x[b, h, i + half] * sin[b, i]
