"""What several references share: a value as the kernels store it."""

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16)
import numpy as np


def stored(x: np.ndarray, dtype: str) -> np.ndarray:
    """`x` (float64) as a kernel stores it in `dtype` ("float32" | "bfloat16"), in float64: rounded to the nearest
    even value of `dtype`. A float64 copy of a float32 value rounds as the float32 value does (no double rounding)."""
    return x.astype(dtype).astype(np.float64)
