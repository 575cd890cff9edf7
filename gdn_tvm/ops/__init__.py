"""TensorIR definitions, one module per op: `make_<op>(cfg, **flags)` and `signature(cfg, **flags)`."""

from . import causal_conv1d_silu
from . import per_head_l2_norm
from . import gates
from . import delta_rule
from . import gated_rmsnorm
from . import split_interleaved
from . import per_head_rmsnorm
from . import partial_neox_rope
from . import kv_row_scatter
from . import decode_attention
from . import sigmoid_gate
from . import gemv  # noqa: F401

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
