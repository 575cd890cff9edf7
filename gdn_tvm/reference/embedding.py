"""embedding reference."""

import numpy as np


def embedding(ids: np.ndarray, table: np.ndarray, rows: np.ndarray) -> None:
    """ids: [B]; table: [V, hidden] -> rows[:] = table[ids], widened to rows' dtype (exact), a zero row where an id
    is outside [0, V)."""
    valid = (ids >= 0) & (ids < table.shape[0])
    rows[...] = np.where(valid[:, None], table[np.where(valid, ids, 0)].astype(rows.dtype), 0.0)
