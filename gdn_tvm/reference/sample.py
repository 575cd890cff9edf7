"""sample reference: the same choices as the kernel by other means (a sort instead of bitwise threshold searches)."""

import numpy as np

from gdn_tvm.philox import uniform


def sample(
    logits: np.ndarray,
    temperature: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    seed: np.ndarray,
    step: np.ndarray,
    tokens: np.ndarray,
    **scratch: np.ndarray,
) -> None:
    """logits: [B, V]; temperature, top_k, top_p, seed, step: [B] -> tokens[:] (int32), per ops/sample.py (the
    kernel's `scratch` workspace holds no result)."""
    V = logits.shape[1]
    for b, row in enumerate(logits):
        if not temperature[b] > 0:  # 0, negative or NaN: greedy
            tokens[b] = np.argmax(row)  # the first index of the largest
            continue
        k = int(top_k[b]) if 0 < top_k[b] < V else V
        kept = row >= np.sort(row)[::-1][k - 1]
        w = np.exp((row - row.max()) / temperature[b])
        if top_p[b] < 1:
            order = np.argsort(-row[kept], kind="stable")
            values, mass = row[kept][order], np.cumsum(w[kept][order])
            tie_end = np.r_[values[1:] != values[:-1], True]  # the last of each run of equal logits
            enough = np.flatnonzero(tie_end & (mass >= top_p[b] * w[kept].sum()))[0]
            kept &= row >= values[enough]
        cdf = np.cumsum(np.where(kept, w, 0.0))
        drawn = int(np.searchsorted(cdf, uniform(seed[b], step[b]) * cdf[-1], side="right"))
        tokens[b] = drawn if drawn < V else np.flatnonzero(kept)[-1]
