"""decode_attention_reduce reference (float64 numpy): merge the split-KV partials of `decode_attention_split` and
gate the result."""

from __future__ import annotations

import numpy as np

from gdn_tvm.reference.activations import sigmoid
from gdn_tvm.reference.decode_attention import active_lanes


def decode_attention_reduce(m, l, acc, gate, slots, positions, out, *, split_len: int) -> None:
    """m, l: [B, Hq, n_splits], acc: [B, Hq, n_splits, D]; gate: [B, Hq, D]; slots, positions: [B] -> out: [B, Hq, D].
    Merge the valid splits j <= positions[b] // split_len (the others are never read):
    out = sigmoid(gate) * sum_j w_j acc_j / sum_j w_j l_j with w_j = exp(m_j - max_j m_j). Skipped lanes stay
    untouched."""
    for b, _, last in active_lanes(slots, positions):
        n = last // split_len + 1
        w = np.exp(m[b, :, :n] - m[b, :, :n].max(-1, keepdims=True))
        merged = np.einsum("hj,hjd->hd", w, acc[b, :, :n]) / (w * l[b, :, :n]).sum(-1)[:, None]
        out[b] = merged * sigmoid(gate[b])
