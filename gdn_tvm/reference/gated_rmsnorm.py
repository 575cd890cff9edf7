"""gated_rmsnorm reference."""

import numpy as np

from gdn_tvm.reference.activations import silu


def gated_rmsnorm(o: np.ndarray, z: np.ndarray, w: np.ndarray, y: np.ndarray, *, rms_norm_eps: float) -> None:
    """o, z: [B, Hv, Dv]; w: [Dv] -> y[:] = o * rsqrt(mean(o^2) + rms_norm_eps) * w * silu(z), per head."""
    y[...] = o / np.sqrt((o * o).mean(axis=-1, keepdims=True) + rms_norm_eps) * w * silu(z)
