"""attention_prologue reference: the four references it fuses, in order."""

import numpy as np

from gdn_tvm.reference.kv_row_scatter import kv_row_scatter
from gdn_tvm.reference.partial_neox_rope import partial_neox_rope
from gdn_tvm.reference.per_head_rmsnorm import per_head_rmsnorm
from gdn_tvm.reference.split_interleaved import split_interleaved


def attention_prologue(
    q_gate: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slots: np.ndarray,
    positions: np.ndarray,
    q_out: np.ndarray,
    gate: np.ndarray,
    *,
    rms_norm_eps: float,
    rope_theta: float,
    partial_rotary_factor: float,
    kv_dtype: str,
) -> None:
    """q_gate: [B, Hq, 2D], k, v: [B, Hkv, D] -> q_out[:] (q normalised and rotated), gate[:]: [B, Hq, D]; the caches'
    rows `(slots[b], positions[b])` set to k normalised and rotated and to v, as stored in `kv_dtype`."""
    q = np.empty(q_out.shape)
    split_interleaved(q_gate, q, gate)
    q_normed, k_normed, k_rotated = np.empty(q.shape), np.empty(k.shape), np.empty(k.shape)
    per_head_rmsnorm(q, k, q_norm, k_norm, q_normed, k_normed, rms_norm_eps=rms_norm_eps)
    partial_neox_rope(q_normed, k_normed, positions, q_out, k_rotated, rope_theta, partial_rotary_factor)
    kv_row_scatter(k_rotated, v, k_cache, v_cache, slots, positions, kv_dtype=kv_dtype)
