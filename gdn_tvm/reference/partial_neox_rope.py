"""partial_neox_rope reference."""

import numpy as np

from gdn_tvm.config import ModelConfig


def partial_neox_rope(
    q: np.ndarray,
    k: np.ndarray,
    positions: np.ndarray,
    q_out: np.ndarray,
    k_out: np.ndarray,
    rope_theta: float = ModelConfig.rope_theta,
    partial_rotary_factor: float = ModelConfig.partial_rotary_factor,
) -> None:
    """q: [B, Hq, D], k: [B, Hkv, D] at `positions` [B] -> q_out[:], k_out[:].

    NeoX rotation of the first `n_rot = D * partial_rotary_factor` dims per head, angles in float64.
    """
    D = q.shape[-1]
    n_rot = int(D * partial_rotary_factor)
    half = n_rot // 2
    angle = positions.astype(np.float64)[:, None, None] * rope_theta ** (-2.0 * np.arange(half) / n_rot)  # [B, 1, half]
    cos, sin = np.cos(angle), np.sin(angle)
    for x, y in ((q, q_out), (k, k_out)):
        x0, x1 = x[..., :half], x[..., half:n_rot]
        y[..., :half] = x0 * cos - x1 * sin
        y[..., half:n_rot] = x0 * sin + x1 * cos
        y[..., n_rot:] = x[..., n_rot:]
