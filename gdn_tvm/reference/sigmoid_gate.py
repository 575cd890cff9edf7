"""sigmoid_gate reference."""

import numpy as np


def sigmoid_gate(x: np.ndarray, gate: np.ndarray, y: np.ndarray) -> None:
    """x, gate: [B, Hq, D] -> y[:] = x * sigmoid(gate)."""
    y[...] = x / (1.0 + np.exp(-gate))
