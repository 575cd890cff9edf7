"""The references' activations, free of overflow at any input: sigmoid, SiLU, softplus (docs/math.md)."""

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)), as exp(-log(1 + exp(-x))): no overflow for large negative x."""
    return np.exp(-np.logaddexp(0.0, -x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)), and x itself above 20 (docs/math.md step 5)."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
