"""decode_attention_reduce: merge the split-KV partials of `decode_attention_split` into the gated attention output.

Per active lane `b` with `n = positions[b] // split_len + 1` valid splits and query head `h`:
`out = sigmoid(gate) * sum_j e^(m_j - M) acc_j / sum_j e^(m_j - M) l_j` over `j < n`, `M = max_j m_j` (the
attention layer's output gate as the merge's epilogue, so no `sigmoid_gate` launch follows); the splits past `n`
hold stale values (or NaN) and are never used. A lane with `slots[b] == -1` is skipped (no output written).
SBlocks (the schedules' interface): "reduce" per (lane, head, chunk of D), inside it "part_max", "part_den",
"part_num" over groups of splits, then "max", "den", "num" over the groups and "normalize" (see
`make_decode_attention_reduce`).
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.decode_attention import lane_args, partials
from gdn_tvm.ops.sigmoid_gate import gated
from gdn_tvm.signature import Arg
from gdn_tvm.target import DEFAULT_GPU, GpuSpec

REDUCE_WIDE_ROWS = 128  # from this many (lane, head) rows on, one reduce block per (lane, head) fills the GPU


def signature(cfg: DecodeConfig) -> list[Arg]:
    """m, l: [B, Hq, n_splits], acc: [B, Hq, n_splits, D] (the split partials); gate: [B, Hq, D]; slots,
    positions: [B] int32 -> out: [B, Hq, D] float32."""
    shape = (cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim)
    return [
        *partials(cfg),
        Arg("gate", shape),
        *lane_args(cfg),
        Arg("out", shape, role="out"),
    ]


def reduce_layout(cfg: DecodeConfig, gpu: GpuSpec | None = None) -> tuple[int, int]:
    """(split groups, elements of D per block) of the reduce, by its count of (lane, head) rows.

    Few rows (B=1): 32 groups x 64-wide chunks, so a head spreads over D / 64 blocks of 32 groups x 16 float4
    threads (qwen3.5-4b at 32k on the H200: 6.1 us; one block of 8 groups a head took 23.5 us). Many rows
    (B=32): one block per (lane, head) of up to 8 groups x all of D (8.8 us at qwen3.5-4b B=32, 4096 positions; the
    chunked layout took 30.0 us there, its blocks too small), halving the groups until every block is resident at
    once on `gpu` (default `DEFAULT_GPU`; its resident threads, D/4 a group): at B=256, 8 groups made 7.8 waves of
    512-thread blocks, each a chain of dependent loads (35.9 us for 38 MB); one group a block, its splits in flight
    together, is one wave."""
    gpu = gpu or DEFAULT_GPU
    B, Hq, D, NS = cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim, cfg.n_splits
    if B * Hq < REDUCE_WIDE_ROWS:
        return min(32, NS), min(64, D)
    groups = 8
    while groups > 1 and B * Hq * groups * (D // 4) > gpu.resident_threads:
        groups //= 2
    return min(groups, NS), D


def make_decode_attention_reduce(cfg: DecodeConfig):
    """Per (lane, head, `DC`-wide chunk of D) one block: the splits fall into `GS` groups (`j = g + GS*i`),
    those past the valid `j < n` masked (they hold stale values or lie past the buffer: `split`, `valid`); per group a
    partial max, denominator and numerator (`part_max`, `part_den`, `part_num`), then the groups holding a split
    (`g < n`) merge (`max`, `den`, `num`) and `normalize`. Every chunk recomputes its head's maxima and
    denominators (a few scalars a split). The groups are independent chains of loads (one chain over 256 splits
    took 34 us on the H200, 8 groups 23.5 us); the chunks let a schedule run `GS` groups x `DC` elements per CTA
    within the thread limit and spread a head over `D / DC` CTAs. `normalize` divides by the denominator and
    applies the output gate `sigmoid(gate)`."""
    B, Hq, D, SL, NS = cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim, cfg.split_len, cfg.n_splits
    GS, DC = reduce_layout(cfg)
    NC, GI = D // DC, (NS + GS - 1) // GS  # chunks of D; splits a group at most

    def split(g, i, n):
        """Split `g + GS*i` clamped to the last valid one (`n - 1`, always written, so finite): a group visits all GI
        of its splits, every load unconditional, and `valid` zeroes the splits past `n`, so nvcc issues a group's
        loads together, where a load under a branch waited for the one before it (H200 tuner timings against the
        `if_then_else` form: qwen3.5-4b at 32k 5.49 us against 15.13, B=32 8.17 against 10.81). Stopping at the
        valid splits instead (a run-time count of unrolled 8-split steps) measured slower: 7.87 us at 32k, 10.40 at
        B=32, and 41.9 against 40.7 at B=256."""
        return T.min(g + i * GS, n - 1)

    def valid(g, i, n):
        """1.0 for a split `< n`, else 0.0."""
        return T.Cast("float32", g + i * GS < n)

    def weight(m_j, m_max):
        """`exp(m_j - m_max)` at most 1, so a masked split's term stays finite (exact for the valid ones, `m_j <=
        m_max`; a group without one has `m_max` near the float minimum and drops out of the merge)."""
        return T.exp(T.min(m_j - m_max, T.float32(0)))

    @T.prim_func(s_tir=True)
    def decode_attention_reduce(
        m: T.Buffer((B, Hq, NS), "float32"),
        l: T.Buffer((B, Hq, NS), "float32"),
        acc: T.Buffer((B, Hq, NS, D), "float32"),
        gate: T.Buffer((B, Hq, D), "float32"),
        slots: T.Buffer((B,), "int32"),
        positions: T.Buffer((B,), "int32"),
        out: T.Buffer((B, Hq, D), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        for b, h, c in T.grid(B, Hq, NC):
            n = positions[b] // SL + 1  # valid splits
            for _ in range(T.Select(slots[b] >= 0, 1, 0)):  # skipped lanes exit early
                with T.sblock("reduce"):
                    vb, vh, vc = T.axis.remap("SSS", [b, h, c])
                    pmx = T.sblock_alloc_buffer((B, Hq, NC, GS))
                    pden = T.sblock_alloc_buffer((B, Hq, NC, GS))
                    pnum = T.sblock_alloc_buffer((B, Hq, NC, GS, DC))
                    mx = T.sblock_alloc_buffer((B, Hq, NC))
                    den = T.sblock_alloc_buffer((B, Hq, NC))
                    num = T.sblock_alloc_buffer((B, Hq, NC, DC))
                    for g in range(GS):
                        for i in range(GI):
                            with T.sblock("part_max"):
                                vg = T.axis.spatial(GS, g)
                                vi = T.axis.reduce(NS, i)
                                with T.init():
                                    pmx[vb, vh, vc, vg] = T.min_value("float32")
                                pmx[vb, vh, vc, vg] = T.max(
                                    pmx[vb, vh, vc, vg],
                                    m[vb, vh, split(vg, vi, n)]
                                    + T.Select(vg + vi * GS < n, T.float32(0), T.min_value("float32")),
                                )
                    for g in range(GS):
                        for i in range(GI):
                            with T.sblock("part_den"):
                                vg = T.axis.spatial(GS, g)
                                vi = T.axis.reduce(NS, i)
                                with T.init():
                                    pden[vb, vh, vc, vg] = T.float32(0)
                                pden[vb, vh, vc, vg] = (
                                    pden[vb, vh, vc, vg]
                                    + valid(vg, vi, n)
                                    * weight(m[vb, vh, split(vg, vi, n)], pmx[vb, vh, vc, vg])
                                    * l[vb, vh, split(vg, vi, n)]
                                )
                    for g, d in T.grid(GS, DC):
                        for i in range(GI):
                            with T.sblock("part_num"):
                                vg, vd = T.axis.remap("SS", [g, d])
                                vi = T.axis.reduce(NS, i)
                                with T.init():
                                    pnum[vb, vh, vc, vg, vd] = T.float32(0)
                                pnum[vb, vh, vc, vg, vd] = (
                                    pnum[vb, vh, vc, vg, vd]
                                    + valid(vg, vi, n)
                                    * weight(m[vb, vh, split(vg, vi, n)], pmx[vb, vh, vc, vg])
                                    * acc[vb, vh, split(vg, vi, n), vc * DC + vd]
                                )
                    for g in range(T.min(GS, n)):  # the groups holding a split (g < n)
                        with T.sblock("max"):
                            vg = T.axis.reduce(GS, g)
                            with T.init():
                                mx[vb, vh, vc] = T.min_value("float32")
                            mx[vb, vh, vc] = T.max(mx[vb, vh, vc], pmx[vb, vh, vc, vg])
                    for g in range(T.min(GS, n)):
                        with T.sblock("den"):
                            vg = T.axis.reduce(GS, g)
                            with T.init():
                                den[vb, vh, vc] = T.float32(0)
                            den[vb, vh, vc] = (
                                den[vb, vh, vc] + T.exp(pmx[vb, vh, vc, vg] - mx[vb, vh, vc]) * pden[vb, vh, vc, vg]
                            )
                    for d, g in T.grid(DC, T.min(GS, n)):
                        with T.sblock("num"):
                            vd, vg = T.axis.remap("SR", [d, g])
                            with T.init():
                                num[vb, vh, vc, vd] = T.float32(0)
                            num[vb, vh, vc, vd] = (
                                num[vb, vh, vc, vd]
                                + T.exp(pmx[vb, vh, vc, vg] - mx[vb, vh, vc]) * pnum[vb, vh, vc, vg, vd]
                            )
                    for d in range(DC):
                        with T.sblock("normalize"):
                            vd = T.axis.spatial(DC, d)
                            out[vb, vh, vc * DC + vd] = gated(
                                num[vb, vh, vc, vd] / den[vb, vh, vc], gate[vb, vh, vc * DC + vd]
                            )

    return decode_attention_reduce
