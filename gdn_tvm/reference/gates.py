"""gates reference."""

import numpy as np

from gdn_tvm.reference.activations import sigmoid, softplus


def gates(a: np.ndarray, b: np.ndarray, A: np.ndarray, dt_bias: np.ndarray, g: np.ndarray, beta: np.ndarray) -> None:
    """a, b: [B, Hv]; A, dt_bias: [Hv] -> g[:] = softplus(a + dt_bias) * A, beta[:] = sigmoid(b)."""
    g[...] = softplus(a + dt_bias) * A
    beta[...] = sigmoid(b)
