"""add_rmsnorm reference (and the plain `rmsnorm`)."""

import numpy as np


def add_rmsnorm(x: np.ndarray, residual: np.ndarray, weight: np.ndarray, y: np.ndarray, *, rms_norm_eps: float) -> None:
    """x, residual: [B, hidden] (residual updated in place: += x); weight: [hidden] (zero-centred, as stored) -> y[:] =
    rmsnorm(residual) * (1 + weight)."""
    residual += x
    rmsnorm(residual, weight, y, rms_norm_eps=rms_norm_eps)


def rmsnorm(x: np.ndarray, weight: np.ndarray, y: np.ndarray, *, rms_norm_eps: float) -> None:
    """x: [B, hidden]; weight: [hidden] (zero-centred, as stored) -> y[:] = x * rsqrt(mean(x^2) + rms_norm_eps) * (1 +
    weight)."""
    y[...] = x / np.sqrt((x * x).mean(-1, keepdims=True) + rms_norm_eps) * (1.0 + weight)
