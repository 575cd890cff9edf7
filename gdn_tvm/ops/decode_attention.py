"""decode_attention: one query token against a slot's KV cache (GQA), unsplit or split-KV ("flash-decoding").

Query head `h` reads kv head `h // G` (`G = Hq // Hkv`); lane `b` attends to rows `t < positions[b] + 1` of cache
slot `slots[b]` (both read on the device); `slots[b] == -1` skips the lane (no output written). Scores are
`q . k_t / sqrt(D)`. The caches are stored in `kv_dtype` and read as float32.

Variants (flag `split`):
  unsplit  (default) one pass over the sequence in chunks of `split_len` rows with an online softmax -> `out`.
  split    per chunk `j` (rows `[j*split_len, (j+1)*split_len)`, only chunks holding a valid row):
           `m` = max score, `l = sum exp(score - m)`, `acc = sum exp(score - m) * v_t` (unnormalised), which the
           op `decode_attention_reduce` merges into `out`.

Both unsplit and split compute each chunk `j` of `n = min(split_len, positions[b] + 1 - j*split_len)` valid rows with
the same SBlocks (the schedules' interface), for the query heads `kh*G + g` of kv head `kh`:
  score (q . k_t, reduce over D), chunk_max (over t), max_out (m = scale * max), prob (exp(scale*score - m), 0 for
  t >= n), sum_out (l), acc_out (acc = sum_t prob_t * v at row min(t, n - 1), reduce over t: no mask around the V
  load, and a row past the sequence is never read).
split writes m, l, acc; unsplit merges them into its running state (init_state, then per chunk merge_acc,
merge_sum, merge_max) and ends with normalize.
A chunk processes its valid rows rounded up to whole tiles (`row_tile`), or all `split_len` rows for split
where `split_len` divides `max_len` (`whole_split`); the extra K rows are masked out of the scores, and
nothing past the sequence is read from V.
"""

from __future__ import annotations

import math

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import widened
from gdn_tvm.signature import Arg

TILE_MAX = 64


def signature(cfg: DecodeConfig, split: bool = False) -> list[Arg]:
    """unsplit: q [B, Hq, D], k_cache/v_cache [S, L, Hkv, D] kv_dtype, slots [B], positions [B] -> out [B, Hq, D].
    split: q, k_cache, v_cache, slots, positions -> m, l [B, Hq, n_splits], acc [B, Hq, n_splits, D]."""
    m = cfg.model
    B, Hq, D = cfg.batch, m.n_q_heads, m.head_dim
    cache = (cfg.slots, cfg.max_len, m.n_kv_heads, D)
    caches = [Arg(name, cache, cfg.kv_dtype) for name in ("k_cache", "v_cache")]
    inputs = [Arg("q", (B, Hq, D)), *caches, *lane_args(cfg)]
    if split:
        return inputs + [Arg(p.name, p.shape, role="out") for p in partials(cfg)]
    return [*inputs, Arg("out", (B, Hq, D), role="out")]


def lane_args(cfg: DecodeConfig) -> list[Arg]:
    """slots [B] int32 (-1 skips the lane) and the lanes' last rows, positions [B] int32."""
    B = cfg.batch
    return [
        Arg("slots", (B,), "int32", role="index", bound=(-1, cfg.slots), slot_pool=True),
        Arg("positions", (B,), "int32", role="index", bound=(0, cfg.max_len)),
    ]


def partials(cfg: DecodeConfig) -> list[Arg]:
    """The split stage's partials as inputs: m, l [B, Hq, n_splits] (l at least 1, as a chunk's sum of
    exponentials whose largest is 1), acc [B, Hq, n_splits, D]."""
    B, Hq, D, ns = cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim, cfg.n_splits
    return [
        Arg("m", (B, Hq, ns)),
        Arg("l", (B, Hq, ns), sample=lambda rng, shape: rng.uniform(1.0, cfg.split_len, shape).astype(np.float32)),
        Arg("acc", (B, Hq, ns, D)),
    ]


def make_decode_attention(cfg: DecodeConfig, split: bool = False):
    """The PrimFunc of split or unsplit (see the module docstring); params in `signature` order."""
    return _split(cfg) if split else _unsplit(cfg)


def _sizes(cfg: DecodeConfig):
    m = cfg.model
    return cfg.batch, cfg.slots, cfg.max_len, m.n_q_heads, m.n_kv_heads, m.head_dim, cfg.split_len, cfg.n_splits


def _cache_shape(*dims: int) -> tuple:
    """int64 extents: S * max_len * Hkv * D can exceed 2^31 (e.g. 128 slots of 32k rows), so index in 64 bits."""
    return tuple(T.int64(n) for n in dims)


def row_tile(cfg: DecodeConfig) -> int:
    """Rows of a chunk are processed in whole tiles of this many rows (it divides split_len and max_len, so a
    tile never leaves the cache); rows of the last tile past the sequence are read but masked out."""
    return math.gcd(cfg.split_len, cfg.max_len, TILE_MAX)


def whole_split(cfg: DecodeConfig, split: bool) -> bool:
    """split processes all `split_len` rows of a chunk (a fixed extent), those past the sequence masked,
    where `split_len` divides `max_len` (no chunk leaves the cache); otherwise, and for unsplit, the valid rows
    rounded up to whole tiles (`row_tile`)."""
    return split and cfg.max_len % cfg.split_len == 0


def _chunk(cfg: DecodeConfig, split: bool):
    """Macro: partials m, l [.., NS] and acc [.., NS, D] of chunk j (its n valid rows) of lane b, kv head kh."""
    _, _, _, Hq, Hkv, D, SL, NS = _sizes(cfg)
    G, scale, tile = Hq // Hkv, T.float32(1.0 / math.sqrt(D)), row_tile(cfg)
    whole = whole_split(cfg, split)

    def padded(n):
        """Rows processed: all `SL` (`whole_split`), or n rounded up to whole tiles."""
        return SL if whole else (n + tile - 1) // tile * tile

    @T.macro
    def chunk(q, k_cache, v_cache, slots, b, kh, j, n, score, cmax, prob, m, l, acc):
        for g, t, d in T.grid(G, padded(n), D):
            with T.sblock("score"):
                vg, vd = T.axis.remap("SR", [g, d])
                vt = T.axis.spatial(SL, t)
                vj = T.axis.spatial(NS, j)
                with T.init():
                    score[b, kh * G + vg, vj, vt] = T.float32(0)
                score[b, kh * G + vg, vj, vt] = score[b, kh * G + vg, vj, vt] + q[b, kh * G + vg, vd] * widened(
                    k_cache[slots[b], vj * SL + vt, kh, vd]
                )
        for g, t in T.grid(G, padded(n)):
            with T.sblock("chunk_max"):
                vg, vt = T.axis.spatial(G, g), T.axis.reduce(SL, t)
                vj = T.axis.spatial(NS, j)
                with T.init():
                    cmax[b, kh * G + vg, vj] = T.min_value("float32")
                cmax[b, kh * G + vg, vj] = T.max(
                    cmax[b, kh * G + vg, vj], T.Select(vt < n, score[b, kh * G + vg, vj, vt], T.min_value("float32"))
                )
        for g in range(G):
            with T.sblock("max_out"):
                vg = T.axis.spatial(G, g)
                vj = T.axis.spatial(NS, j)
                m[b, kh * G + vg, vj] = cmax[b, kh * G + vg, vj] * scale
        for g, t in T.grid(G, padded(n)):
            with T.sblock("prob"):
                vg, vt = T.axis.spatial(G, g), T.axis.spatial(SL, t)
                vj = T.axis.spatial(NS, j)
                prob[b, kh * G + vg, vj, vt] = T.Select(
                    vt < n, T.exp((score[b, kh * G + vg, vj, vt] - cmax[b, kh * G + vg, vj]) * scale), T.float32(0)
                )
        for g, t in T.grid(G, padded(n)):
            with T.sblock("sum_out"):
                vg, vt = T.axis.spatial(G, g), T.axis.reduce(SL, t)
                vj = T.axis.spatial(NS, j)
                with T.init():
                    l[b, kh * G + vg, vj] = T.float32(0)
                l[b, kh * G + vg, vj] = l[b, kh * G + vg, vj] + prob[b, kh * G + vg, vj, vt]
        for g, d, t in T.grid(G, D, padded(n)):
            with T.sblock("acc_out"):
                vg, vd = T.axis.remap("SS", [g, d])
                vt = T.axis.reduce(SL, t)
                vj = T.axis.spatial(NS, j)
                with T.init():
                    acc[b, kh * G + vg, vj, vd] = T.float32(0)
                acc[b, kh * G + vg, vj, vd] = acc[b, kh * G + vg, vj, vd] + prob[b, kh * G + vg, vj, vt] * widened(
                    v_cache[slots[b], vj * SL + T.min(vt, n - 1), kh, vd]
                )

    return chunk


def _split(cfg: DecodeConfig):
    B, S, L, Hq, Hkv, D, SL, NS = _sizes(cfg)
    chunk = _chunk(cfg, True)

    @T.prim_func(s_tir=True)
    def decode_attention_split(
        q: T.Buffer((B, Hq, D), "float32"),
        k_cache: T.Buffer(_cache_shape(S, L, Hkv, D), cfg.kv_dtype),
        v_cache: T.Buffer(_cache_shape(S, L, Hkv, D), cfg.kv_dtype),
        slots: T.Buffer((B,), "int32"),
        positions: T.Buffer((B,), "int32"),
        m: T.Buffer((B, Hq, NS), "float32"),
        l: T.Buffer((B, Hq, NS), "float32"),
        acc: T.Buffer((B, Hq, NS, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        for b, kh, j in T.grid(B, Hkv, NS):
            n = T.min(SL, positions[b] + 1 - j * SL)  # valid rows of split j
            for _ in range(T.Select(slots[b] >= 0 and n > 0, 1, 0)):  # an early exit that keeps syncs legal
                with T.sblock("split"):
                    vb, vkh, vj = T.axis.remap("SSS", [b, kh, j])
                    score = T.sblock_alloc_buffer((B, Hq, NS, SL))
                    cmax = T.sblock_alloc_buffer((B, Hq, NS))
                    prob = T.sblock_alloc_buffer((B, Hq, NS, SL))
                    chunk(q, k_cache, v_cache, slots, vb, vkh, vj, n, score, cmax, prob, m, l, acc)

    return decode_attention_split


def _unsplit(cfg: DecodeConfig):
    B, S, L, Hq, Hkv, D, SL, NC = _sizes(cfg)
    G = Hq // Hkv
    chunk = _chunk(cfg, False)
    cache, f32, KV = _cache_shape(S, L, Hkv, D), "float32", cfg.kv_dtype

    @T.prim_func(s_tir=True)
    def decode_attention(
        q: T.Buffer((B, Hq, D), f32),
        k_cache: T.Buffer(cache, KV),
        v_cache: T.Buffer(cache, KV),
        slots: T.Buffer((B,), "int32"),
        positions: T.Buffer((B,), "int32"),
        out: T.Buffer((B, Hq, D), f32),
    ):
        T.func_attr({"tirx.noalias": True})
        for b, kh in T.grid(B, Hkv):
            last = positions[b]
            for _ in range(T.Select(slots[b] >= 0, 1, 0)):  # skipped lanes exit early
                with T.sblock("unsplit"):
                    vb, vkh = T.axis.remap("SS", [b, kh])
                    T.reads(
                        q[vb, vkh * G : vkh * G + G, 0:D],
                        k_cache[0:S, 0:L, vkh, 0:D],
                        v_cache[0:S, 0:L, vkh, 0:D],
                        slots[vb],
                        positions[vb],
                    )
                    T.writes(out[vb, vkh * G : vkh * G + G, 0:D])
                    cm = T.sblock_alloc_buffer((B, Hq, NC))
                    cl = T.sblock_alloc_buffer((B, Hq, NC))
                    cacc = T.sblock_alloc_buffer((B, Hq, NC, D))
                    mrun = T.sblock_alloc_buffer((B, Hq))
                    lrun = T.sblock_alloc_buffer((B, Hq))
                    arun = T.sblock_alloc_buffer((B, Hq, D))
                    mnew = T.sblock_alloc_buffer((B, Hq))
                    lnew = T.sblock_alloc_buffer((B, Hq))
                    anew = T.sblock_alloc_buffer((B, Hq, D))
                    for g, d in T.grid(G, D):
                        with T.sblock("init_acc"):
                            vg, vd = T.axis.remap("SS", [g, d])
                            arun[vb, vkh * G + vg, vd] = T.float32(0)
                    for g in range(G):
                        with T.sblock("init_stats"):
                            vg = T.axis.spatial(G, g)
                            mrun[vb, vkh * G + vg] = T.min_value("float32")
                            lrun[vb, vkh * G + vg] = T.float32(0)
                    for c in range(last // SL + 1):
                        n = T.min(SL, last + 1 - c * SL)
                        with T.sblock("chunk"):
                            vc = T.axis.spatial(NC, c)
                            score = T.sblock_alloc_buffer((B, Hq, NC, SL))
                            cmax = T.sblock_alloc_buffer((B, Hq, NC))
                            prob = T.sblock_alloc_buffer((B, Hq, NC, SL))
                            chunk(q, k_cache, v_cache, slots, vb, vkh, vc, n, score, cmax, prob, cm, cl, cacc)
                        for g, d in T.grid(G, D):
                            with T.sblock("merge_acc"):
                                vg, vc, vd = T.axis.remap("SSS", [g, c, d])
                                anew[vb, vkh * G + vg, vd] = arun[vb, vkh * G + vg, vd] * T.exp(
                                    mrun[vb, vkh * G + vg] - T.max(mrun[vb, vkh * G + vg], cm[vb, vkh * G + vg, vc])
                                ) + cacc[vb, vkh * G + vg, vc, vd] * T.exp(
                                    cm[vb, vkh * G + vg, vc] - T.max(mrun[vb, vkh * G + vg], cm[vb, vkh * G + vg, vc])
                                )
                        for g in range(G):
                            with T.sblock("merge_stats"):
                                vg, vc = T.axis.remap("SS", [g, c])
                                lnew[vb, vkh * G + vg] = lrun[vb, vkh * G + vg] * T.exp(
                                    mrun[vb, vkh * G + vg] - T.max(mrun[vb, vkh * G + vg], cm[vb, vkh * G + vg, vc])
                                ) + cl[vb, vkh * G + vg, vc] * T.exp(
                                    cm[vb, vkh * G + vg, vc] - T.max(mrun[vb, vkh * G + vg], cm[vb, vkh * G + vg, vc])
                                )
                                mnew[vb, vkh * G + vg] = T.max(mrun[vb, vkh * G + vg], cm[vb, vkh * G + vg, vc])
                        for g, d in T.grid(G, D):
                            with T.sblock("store_acc"):
                                vg, vd = T.axis.remap("SS", [g, d])
                                arun[vb, vkh * G + vg, vd] = anew[vb, vkh * G + vg, vd]
                        for g in range(G):
                            with T.sblock("store_stats"):
                                vg = T.axis.spatial(G, g)
                                lrun[vb, vkh * G + vg] = lnew[vb, vkh * G + vg]
                                mrun[vb, vkh * G + vg] = mnew[vb, vkh * G + vg]
                    for g, d in T.grid(G, D):
                        with T.sblock("normalize"):
                            vg, vd = T.axis.remap("SS", [g, d])
                            out[vb, vkh * G + vg, vd] = arun[vb, vkh * G + vg, vd] / lrun[vb, vkh * G + vg]

    return decode_attention
