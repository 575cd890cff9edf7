"""gates reference."""

import numpy as np


def gates(a: np.ndarray, b: np.ndarray, A: np.ndarray, dt_bias: np.ndarray, g: np.ndarray, beta: np.ndarray) -> None:
    """a, b: [B, Hv]; A, dt_bias: [Hv] -> g[:] = softplus(a + dt_bias) * A, beta[:] = sigmoid(b)."""
    x = a + dt_bias  # softplus(x) = x above 20 (SPEC.md step 5)
    softplus = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    g[...] = softplus * A
    beta[...] = 1.0 / (1.0 + np.exp(-b))
