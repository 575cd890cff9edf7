"""sigmoid_gate reference."""

import numpy as np

from gdn_tvm.reference.activations import sigmoid


def sigmoid_gate(x: np.ndarray, gate: np.ndarray, y: np.ndarray) -> None:
    """x, gate: [B, Hq, D] -> y[:] = x * sigmoid(gate)."""
    y[...] = x * sigmoid(gate)
