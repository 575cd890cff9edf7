"""One whole decode step of each layer mixer, projections included, in float64 numpy.

Written straight from docs/math.md, lane by lane and independently of the per-op references, so a step
composed from the kernels is checked against a second implementation. States are pools indexed by
`slots[b]` and updated in place; a lane with slot -1 is skipped (its output row stays NaN).

GDN weights (`GDN_WEIGHTS`): in_proj_qkv [C, hidden], in_proj_z [Hv*Dv, hidden], in_proj_b/in_proj_a
[Hv, hidden], conv1d [C, Kc], dt_bias [Hv], A [Hv] (= -exp(A_log)), norm [Dv], out_proj [hidden, Hv*Dv].
Attention weights (`ATTENTION_WEIGHTS`): q_proj [Hq*2*D, hidden], k_proj/v_proj [Hkv*D, hidden],
q_norm/k_norm [D] (zero-centred: scaled by 1 + w), o_proj [hidden, Hq*D].
"""

from __future__ import annotations

import numpy as np

from gdn_tvm.config import ModelConfig
from gdn_tvm.reference.activations import sigmoid, silu, softplus
from gdn_tvm.reference.common import stored


def gdn_mixer_step(
    m: ModelConfig,
    w: dict,
    x: np.ndarray,
    conv_state: np.ndarray,
    rec_state: np.ndarray,
    slots: np.ndarray,
    state_dtype: str = "float32",
) -> np.ndarray:
    """x: [B, hidden] -> [B, hidden]; conv_state [S, C, Kc-1], rec_state [S, Hv, Dv, Dk] updated in place, stored
    as `state_dtype` stores it (`o` from the unrounded state)."""
    hk, hv, dk, dv = m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim
    out = np.full((x.shape[0], m.hidden), np.nan)
    for b, s in enumerate(slots):
        if s < 0:
            continue
        mixed = w["in_proj_qkv"] @ x[b]
        z = (w["in_proj_z"] @ x[b]).reshape(hv, dv)
        beta = sigmoid(w["in_proj_b"] @ x[b])
        g = softplus(w["in_proj_a"] @ x[b] + w["dt_bias"]) * w["A"]
        window = np.concatenate([conv_state[s], mixed[:, None]], axis=1)  # [C, Kc]
        conv = silu((window * w["conv1d"]).sum(axis=1))
        conv_state[s] = window[:, 1:]
        q = conv[: hk * dk].reshape(hk, dk)
        k = conv[hk * dk : 2 * hk * dk].reshape(hk, dk)
        v = conv[2 * hk * dk :].reshape(hv, dv)
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + m.l2_norm_eps) / np.sqrt(dk)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + m.l2_norm_eps)
        o = np.empty((hv, dv))
        for h in range(hv):
            kh = m.key_head(h)
            state = rec_state[s, h] * np.exp(g[h])
            d = beta[h] * (v[h] - state @ k[kh])
            state = state + np.outer(d, k[kh])
            rec_state[s, h] = state if state_dtype == "float32" else stored(state, state_dtype)
            o[h] = state @ q[kh]
        o = o / np.sqrt((o * o).mean(-1, keepdims=True) + m.rms_norm_eps) * w["norm"] * silu(z)
        out[b] = w["out_proj"] @ o.reshape(-1)
    return out


def _rope(x: np.ndarray, pos: int, m: ModelConfig) -> np.ndarray:
    half = m.n_rot // 2
    angle = pos * m.rope_theta ** (-2.0 * np.arange(half) / m.n_rot)
    cos, sin = np.cos(angle), np.sin(angle)
    x = x.copy()
    x1, x2 = x[:, :half].copy(), x[:, half : m.n_rot].copy()
    x[:, :half] = x1 * cos - x2 * sin
    x[:, half : m.n_rot] = x1 * sin + x2 * cos
    return x


def attention_mixer_step(
    m: ModelConfig,
    w: dict,
    x: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slots: np.ndarray,
    positions: np.ndarray,
    kv_dtype: str = "float32",
) -> np.ndarray:
    """x: [B, hidden] -> [B, hidden] at `positions[b]`; caches [S, L, Hkv, D] written at that row, each value as
    stored in `kv_dtype`."""
    hq, hkv, d = m.n_q_heads, m.n_kv_heads, m.head_dim
    out = np.full((x.shape[0], m.hidden), np.nan)
    for b, s in enumerate(slots):
        if s < 0:
            continue
        pos = int(positions[b])
        qg = (w["q_proj"] @ x[b]).reshape(hq, 2, d)
        q, gate = qg[:, 0], qg[:, 1]
        k = (w["k_proj"] @ x[b]).reshape(hkv, d)
        v = (w["v_proj"] @ x[b]).reshape(hkv, d)
        q = q / np.sqrt((q * q).mean(-1, keepdims=True) + m.rms_norm_eps) * (1.0 + w["q_norm"])
        k = k / np.sqrt((k * k).mean(-1, keepdims=True) + m.rms_norm_eps) * (1.0 + w["k_norm"])
        q, k = _rope(q, pos, m), _rope(k, pos, m)
        k_cache[s, pos], v_cache[s, pos] = stored(k, kv_dtype), stored(v, kv_dtype)
        attn = np.empty((hq, d))
        for h in range(hq):
            kvh = h // (hq // hkv)
            scores = k_cache[s, : pos + 1, kvh] @ q[h] / np.sqrt(d)
            p = np.exp(scores - scores.max())
            attn[h] = (p / p.sum()) @ v_cache[s, : pos + 1, kvh]
        out[b] = w["o_proj"] @ (attn * sigmoid(gate)).reshape(-1)
    return out
