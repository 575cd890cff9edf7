"""kv_row_scatter reference."""

import numpy as np


def kv_row_scatter(
    k: np.ndarray,
    v: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slots: np.ndarray,
    pos: int | None = None,
    positions: np.ndarray | None = None,
) -> None:
    """k, v: [B, Hkv, D] -> k_cache, v_cache [S, max_len, Hkv, D] row `(slots[b], pos_b)` set in place.

    `pos_b` is `pos` for every lane or `positions[b]`; lanes with `slots[b] == -1` are skipped.
    """
    lanes = np.flatnonzero(slots >= 0)
    rows = np.full(len(slots), pos) if positions is None else positions
    k_cache[slots[lanes], rows[lanes]] = k[lanes]
    v_cache[slots[lanes], rows[lanes]] = v[lanes]
