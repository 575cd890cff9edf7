"""gemv reference."""

import numpy as np


def gemv(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """w: [N, K], x: [B, K] -> y[:] = x @ w.T, [B, N]."""
    y[...] = x @ w.T
