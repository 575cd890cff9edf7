"""argmax reference."""

import numpy as np


def argmax(
    logits: np.ndarray, chunk_max: np.ndarray, chunk_first: np.ndarray, tokens: np.ndarray, arrivals: np.ndarray
) -> None:
    """logits: [B, V] -> chunk_max[:], chunk_first[:] (int32): [B, C], each chunk's (L = ceil(V / C) logits, the last
    one shorter where C does not divide V) largest value and the row index of its first occurrence; tokens[:] (int32):
    [B], the first index of each row's largest value; arrivals[:] (int32): [B], zero."""
    B, V = logits.shape
    C = chunk_max.shape[1]
    L = -(-V // C)
    chunks = np.full((B, C * L), -np.inf)
    chunks[:, :V] = logits
    chunks = chunks.reshape(B, C, L)  # the padding (-inf, after the last chunk's logits) is never its first max
    chunk_max[...] = chunks.max(axis=2)
    chunk_first[...] = chunks.argmax(axis=2) + L * np.arange(C)
    tokens[...] = np.argmax(logits, axis=1)
    arrivals[...] = 0
