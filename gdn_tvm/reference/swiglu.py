"""swiglu reference."""

import numpy as np

from gdn_tvm.reference.activations import silu


def swiglu(x: np.ndarray, y: np.ndarray) -> None:
    """x: [B, 2I] (gate, then up) -> y[:] = silu(gate) * up, [B, I]."""
    gate, up = np.split(x, 2, axis=1)
    y[...] = silu(gate) * up
