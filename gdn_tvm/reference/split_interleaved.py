"""split_interleaved reference."""

import numpy as np


def split_interleaved(src: np.ndarray, q: np.ndarray, gate: np.ndarray) -> None:
    """src: [B, Hq, 2*D] per head `[q | gate]` -> q[:], gate[:]: [B, Hq, D]."""
    D = q.shape[-1]
    q[...] = src[..., :D]
    gate[...] = src[..., D:]
