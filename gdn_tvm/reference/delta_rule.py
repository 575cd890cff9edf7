"""delta_rule reference (docs/math.md step 6)."""

import numpy as np

from gdn_tvm.reference.common import stored
from gdn_tvm.reference.gates import gates
from gdn_tvm.reference.per_head_l2_norm import per_head_l2_norm


def delta_rule(
    qk: np.ndarray,
    qkv: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray,
    slots: np.ndarray,
    o: np.ndarray,
    head_mapping: str = "grouped",
    state_dtype: str = "float32",
) -> None:
    """qk: [B, 2*Hk, Dk]; qkv: [B, C]; g, beta: [B, Hv]; state: [S, Hv, Dv, Dk], updated in place -> o: [B, Hv, Dv].

    Per active lane (slots[b] >= 0) and value head h with key head kh ("grouped": h // (Hv/Hk), "tiled": h % Hk):
    S = exp(g)*S; S += outer(beta*(v - S @ k), k); o = S @ q / sqrt(Dk). Skipped lanes are left untouched. The
    state is stored as `state_dtype` stores it (a bf16 state rounded after the update; `o` from the unrounded S).
    """
    hk, dk = qk.shape[1] // 2, qk.shape[2]
    hv, dv = state.shape[1], state.shape[2]
    heads = np.arange(hv)
    kh = heads // (hv // hk) if head_mapping == "grouped" else heads % hk
    lanes = np.flatnonzero(slots >= 0)
    s = slots[lanes]
    q = qk[lanes, :hk][:, kh] / np.sqrt(dk)  # [n, Hv, Dk]
    k = qk[lanes, hk:][:, kh]
    v = qkv[lanes, 2 * hk * dk :].reshape(len(lanes), hv, dv)
    S = state[s] * np.exp(g[lanes])[..., None, None]  # [n, Hv, Dv, Dk]
    d = beta[lanes][..., None] * (v - np.einsum("nhij,nhj->nhi", S, k))
    S = S + d[..., :, None] * k[..., None, :]
    state[s] = S if state_dtype == "float32" else stored(S, state_dtype)
    o[lanes] = np.einsum("nhij,nhj->nhi", S, q)


def delta_rule_fused(
    qkv: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    A: np.ndarray,
    dt_bias: np.ndarray,
    state: np.ndarray,
    slots: np.ndarray,
    o: np.ndarray,
    head_mapping: str = "grouped",
    state_dtype: str = "float32",
    *,
    l2_norm_eps: float,
) -> None:
    """qkv: [B, C]; a, b: [B, Hv]; A, dt_bias: [Hv]; state: [S, Hv, Dv, Dk], updated in place -> o: [B, Hv, Dv].

    docs/math.md steps 4-6 in one: per_head_l2_norm of the q and k heads of qkv (plus `l2_norm_eps`), gates, then
    delta_rule."""
    hv, dv, dk = state.shape[1], state.shape[2], state.shape[3]
    qk = np.empty((qkv.shape[0], (qkv.shape[1] - hv * dv) // dk, dk))
    g, beta = np.empty_like(a), np.empty_like(b)
    per_head_l2_norm(qkv, qk, l2_norm_eps=l2_norm_eps)
    gates(a, b, A, dt_bias, g, beta)
    delta_rule(qk, qkv, g, beta, state, slots, o, head_mapping, state_dtype)
