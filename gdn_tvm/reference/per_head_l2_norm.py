"""per_head_l2_norm reference."""

import numpy as np


def per_head_l2_norm(qkv: np.ndarray, qk: np.ndarray, *, l2_norm_eps: float) -> None:
    """qkv: [B, conv_dim] -> qk[:] = x * rsqrt(sum(x^2) + l2_norm_eps) per head of x = qkv[:, :2*Hk*Dk] as
    [B, 2*Hk, Dk]."""
    x = qkv[:, : qk.shape[1] * qk.shape[2]].reshape(qk.shape)
    qk[...] = x / np.sqrt((x * x).sum(axis=-1, keepdims=True) + l2_norm_eps)
