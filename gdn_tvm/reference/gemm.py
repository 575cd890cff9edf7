"""gemm reference."""

import numpy as np


def gemm(w: np.ndarray, xs: np.ndarray, **outputs: np.ndarray) -> None:
    """w: [N, K], xs: [2, B, K] (x's two bf16 rows) -> xs[0] @ w.T + xs[1] @ w.T, [B, N], its columns in turn into
    `outputs` (`y`, or a stacked projection's parts in row order)."""
    full = xs[0] @ w.T + xs[1] @ w.T
    start = 0
    for out in outputs.values():
        out[...] = full[:, start : start + out.shape[1]]
        start += out.shape[1]
