"""causal_conv1d_silu reference."""

import numpy as np

from gdn_tvm.reference.activations import silu


def causal_conv1d_silu(x: np.ndarray, weight: np.ndarray, state: np.ndarray, slots: np.ndarray, y: np.ndarray) -> None:
    """x: [B, C]; weight: [C, Kc]; state: [S, C, Kc-1], shifted in place; slots: [B] -> y: [B, C].

    Lanes with slot -1 leave their state and y untouched.
    """
    lanes = np.flatnonzero(slots >= 0)
    s = slots[lanes]
    window = np.concatenate([state[s], x[lanes, :, None]], axis=-1)  # [lanes, C, Kc]
    acc = (window * weight).sum(axis=-1)
    y[lanes] = silu(acc)
    state[s] = window[..., 1:]
