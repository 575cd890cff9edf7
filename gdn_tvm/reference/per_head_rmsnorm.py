"""per_head_rmsnorm reference."""

import numpy as np


def per_head_rmsnorm(
    q: np.ndarray,
    k: np.ndarray,
    q_norm: np.ndarray,
    k_norm: np.ndarray,
    q_out: np.ndarray,
    k_out: np.ndarray,
    *,
    rms_norm_eps: float,
) -> None:
    """q: [B, Hq, D], k: [B, Hkv, D], weights [D] (zero-centred, as stored) -> q_out[:], k_out[:] = x * rsqrt(mean(x^2)
    + rms_norm_eps) * (1 + w)."""
    for x, w, y in ((q, q_norm, q_out), (k, k_norm, k_out)):
        y[...] = x / np.sqrt((x * x).mean(-1, keepdims=True) + rms_norm_eps) * (1.0 + w)
