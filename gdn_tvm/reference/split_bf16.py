"""split_bf16 reference."""

import numpy as np

from gdn_tvm.reference.common import stored


def split_bf16(x: np.ndarray, xs: np.ndarray) -> None:
    """x: [B, K] -> xs[0] = bf16(x), xs[1] = bf16(x - xs[0]), [2, B, K] (x - xs[0] is exact: x is a float32 value)."""
    xs[0] = stored(x, "bfloat16")
    xs[1] = stored(x - xs[0], "bfloat16")
