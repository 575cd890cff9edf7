"""kv_row_scatter reference."""

import numpy as np

from gdn_tvm.reference.common import stored


def kv_row_scatter(
    k: np.ndarray,
    v: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    slots: np.ndarray,
    positions: np.ndarray,
    *,
    kv_dtype: str,
) -> None:
    """k, v: [B, Hkv, D] -> k_cache, v_cache [S, max_len, Hkv, D] row `(slots[b], positions[b])` set in place to the
    row as stored in `kv_dtype`; lanes with `slots[b] == -1` are skipped."""
    lanes = np.flatnonzero(slots >= 0)
    k_cache[slots[lanes], positions[lanes]] = stored(k[lanes], kv_dtype)
    v_cache[slots[lanes], positions[lanes]] = stored(v[lanes], kv_dtype)
