"""decode_attention references: unsplit and split-KV partials (float64 numpy, docs/math.md step 6; their reduce is
`decode_attention_reduce`).

q: [B, Hq, D]; k_cache, v_cache: [S, L, Hkv, D]; slots: [B] (-1 skips the lane: its outputs stay untouched);
positions: [B]; lane b attends to rows t < positions[b] + 1 of slot slots[b];
query head h reads kv head h // (Hq // Hkv); scores are q . k_t / sqrt(D).
Split j covers rows [j*split_len, (j+1)*split_len); it is valid for a lane iff j*split_len <= positions[b].
"""

from __future__ import annotations

import numpy as np


def active_lanes(slots: np.ndarray, positions: np.ndarray) -> list[tuple[int, int, int]]:
    """(lane, slot, last valid row) of the active lanes."""
    return [(b, int(s), int(p)) for b, (s, p) in enumerate(zip(slots, positions, strict=True)) if s >= 0]


def _head_rows(cache: np.ndarray, slot: int, rows: slice, hq: int) -> np.ndarray:
    """cache rows of `slot` per query head: [Hq, T, D]."""
    hkv = cache.shape[2]
    return cache[slot, rows][:, np.arange(hq) // (hq // hkv)].transpose(1, 0, 2)


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q: [Hq, D], k: [Hq, T, D] -> [Hq, T]."""
    return np.einsum("hd,htd->ht", q, k) / np.sqrt(q.shape[-1])


def decode_attention(q, k_cache, v_cache, slots, positions, out) -> None:
    """out[b, h] = softmax_t(scores) @ v over t <= positions[b] -> out: [B, Hq, D]."""
    hq = q.shape[1]
    for b, s, last in active_lanes(slots, positions):
        sc = _scores(q[b], _head_rows(k_cache, s, slice(0, last + 1), hq))
        p = np.exp(sc - sc.max(-1, keepdims=True))
        out[b] = np.einsum("ht,htd->hd", p / p.sum(-1, keepdims=True), _head_rows(v_cache, s, slice(0, last + 1), hq))


def decode_attention_split(q, k_cache, v_cache, slots, positions, m, l, acc, *, split_len: int) -> None:
    """Per valid split j: m [B, Hq, n_splits] = max score, l = sum exp(score - m),
    acc [B, Hq, n_splits, D] = sum exp(score - m) v_t. Invalid splits and skipped lanes stay untouched."""
    hq = q.shape[1]
    for b, s, last in active_lanes(slots, positions):
        for j in range(last // split_len + 1):
            rows = slice(j * split_len, min((j + 1) * split_len, last + 1))
            sc = _scores(q[b], _head_rows(k_cache, s, rows, hq))
            m[b, :, j] = sc.max(-1)
            p = np.exp(sc - m[b, :, j, None])
            l[b, :, j] = p.sum(-1)
            acc[b, :, j] = np.einsum("ht,htd->hd", p, _head_rows(v_cache, s, rows, hq))
