"""TensorIR definitions, one module per op: `make_<op>(cfg, **flags)` and `signature(cfg, **flags)`."""

from . import (
    causal_conv1d_silu,
    decode_attention,
    delta_rule,
    gated_rmsnorm,
    gates,
    gemv,  # noqa: F401
    kv_row_scatter,
    partial_neox_rope,
    per_head_l2_norm,
    per_head_rmsnorm,
    sigmoid_gate,
    split_interleaved,
)

__all__ = [
    "causal_conv1d_silu",
    "per_head_l2_norm",
    "gates",
    "delta_rule",
    "gated_rmsnorm",
    "split_interleaved",
    "per_head_rmsnorm",
    "partial_neox_rope",
    "kv_row_scatter",
    "decode_attention",
    "sigmoid_gate",
    "gemv",
]
