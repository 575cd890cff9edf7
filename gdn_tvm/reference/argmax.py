"""argmax reference."""

import numpy as np


def argmax(logits: np.ndarray, tokens: np.ndarray) -> None:
    """logits: [B, V] -> tokens[:] (int32): the first index of each row's largest value."""
    tokens[...] = np.argmax(logits, axis=1)
