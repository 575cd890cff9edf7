"""decode_attention schedules.

CUDA, split and unsplit (one CTA per lane, kv head and split; unsplit loops over the chunks in one CTA per lane
and kv head): `warps` warps as threadIdx.y = `warps * 32 / lanes` rows of threadIdx.x = `lanes` threads (a warp
holds `32 / lanes` rows; `lanes` 32, or 8 for split). Scores: one row per position (`positions` consecutive
positions per warp step, `positions * lanes / 32` per row), each thread loads `D / (lanes*vector)` vector-wide
pieces of the K row once for the G query heads of its kv head, in-thread dot products then a shuffle reduction
over the row's lanes (log2(lanes) levels: at 8 lanes, each shuffle serves the 4 positions of a warp), into shared
memory. Max and sum over the chunk: all threads, cross-thread reductions. Values: `D / (lanes*vector)` rows per V
row, per-row-group partial sums in registers (rfactor), summed across the groups through shared memory (the thread
of linear index `i` owns the same elements at either `lanes`). The split partials' reduce is
`decode_attention_reduce`.
"""

from __future__ import annotations

import tvm
from tvm import s_tir

from gdn_tvm.config import DecodeConfig
from gdn_tvm.target import DEFAULT_GPU, GpuSpec

WARP = 32

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"warps": (2, 4, 8, 16), "positions": (2, 4, 8), "lanes": (8, 32)}
UNROLL_ROW_STEPS = 4  # `_unroll_rows`
SPLIT_LANES = 8  # split's default `lanes`
SPLIT_WARPS_PER_SM = 64  # split's default warps a CTA stop halving at this many warps an SM (all CTAs)


def _lanes(sch: s_tir.Schedule, loop, lanes: int, vector: int):
    """A loop over D -> (threadIdx.x, serial, vector): lane `x` owns elements `(i*lanes + x)*vector + v` (the `lanes`
    threads of a row load `lanes*vector` contiguous elements at each `i`)."""
    lo, tx, v = sch.split(loop, factors=[None, lanes, vector])
    sch.reorder(tx, lo, v)
    sch.bind(tx, "threadIdx.x")
    return lo, v


def _all_threads(sch: s_tir.Schedule, loop, rows: int, lanes: int) -> None:
    """A loop over positions -> (threadIdx.y, threadIdx.x, serial): a reduction over every thread of the CTA."""
    lo, ty, tx = sch.split(loop, factors=[None, rows, lanes])
    sch.reorder(ty, tx, lo)
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def _spread(sch: s_tir.Schedule, loop, rows: int, lanes: int, vector: int) -> None:
    """An element-wise loop -> (serial, threadIdx.y, threadIdx.x, vector)."""
    _, ty, tx, v = sch.split(loop, factors=[None, rows, lanes, vector])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)


def cuda_warps(cfg: DecodeConfig, split: bool, warps: int | None, vector: int, gpu: GpuSpec = DEFAULT_GPU) -> int:
    """`warps`, or the most whose shared memory fits a CTA of `gpu`: the chunk's scores [G, split_len], q [G, D], the
    per-position-group partial sums [groups, G, D] (+ the running state [2, G, D] for unsplit). For unsplit (from 8),
    the CTA's float4s must also tile the G x D running state evenly: its merge, predicated, would hold barriers
    inside a condition, which TVM refuses (qwen3.5-27b's G = 6 with 8 warps). split starts from 16 warps
    and halves them (down to 2) until its CTAs hold at most `SPLIT_WARPS_PER_SM` warps an SM, of which about half
    run (at the middle of the cache, where the tuner times it, half the splits exit at once): the knob-grid winners
    of all 5 split workloads on the H200 with 8 lanes a position (B=1 at 4096 rows, 64 and 128 CTAs: 16 warps;
    B=1 at 32k rows, 1024 CTAs: 8, 1.39x the 2 that won at the last row; B=32, 4096 CTAs: 2)."""
    if warps is not None:
        return warps
    m = cfg.model
    group, d = m.n_q_heads // m.n_kv_heads, m.head_dim
    halves = d // (WARP * vector)
    extra = 0 if split else 2 * d
    w = 16 if split else 8
    while split and w > 2 and cfg.batch * m.n_kv_heads * cfg.n_splits * w > SPLIT_WARPS_PER_SM * gpu.sms:
        w //= 2
    while w > halves and (
        4 * group * (cfg.split_len + d + w // halves * d + extra) > gpu.shared_memory_per_block - 1024
        or (not split and group * d % (w * WARP * vector))
    ):
        w //= 2
    return w


def _unroll_rows(sch: s_tir.Schedule, loop) -> None:
    """Unroll a loop over a chunk's row steps where its extent is fixed (`whole_split`) and at most
    `UNROLL_ROW_STEPS`, so every load of the chunk issues at once (qwen3.5 at B=1, 16 warps over 128 rows: 2 K and 4 V
    steps; the 0.8b split 14.0 -> 10.5 us on the H200 at the middle of a 4096-row cache); more steps (B=32's 2-warp
    CTAs) unrolled need more registers than a thread has (302 against 170 us)."""
    extent = sch.get(loop).extent
    if isinstance(extent, tvm.tirx.IntImm) and extent.value <= UNROLL_ROW_STEPS:
        sch.unroll(loop)


def _cuda_chunk(sch: s_tir.Schedule, cfg: DecodeConfig, warps: int, positions: int, lanes: int, vector: int):
    """The chunk blocks of split and unsplit on `warps * 32 / lanes` rows of `lanes` threads; returns the cross-group
    sum block of acc_out."""
    rows = warps * WARP // lanes
    b_score = sch.get_sblock("score")
    g, t, d = sch.get_loops(b_score)[-3:]
    sch.reorder(t, g)
    k_row = sch.cache_read(b_score, "k_cache", "local")
    q_smem = sch.cache_read(b_score, "q", "shared")
    per_row = positions * lanes // WARP
    to, ty, p = sch.split(t, factors=[None, rows, per_row])
    sch.reorder(ty, to, g, p)  # every row is used by the first head: the loads of all rows issue together
    sch.compute_at(k_row, to)
    sch.bind(ty, "threadIdx.y")
    _unroll_rows(sch, to)
    sch.unroll(p)
    sch.unroll(g)
    for loop in (sch.get_loops(b_score)[-1], sch.get_loops(k_row)[-1]):
        lo, v = _lanes(sch, loop, lanes, vector)
        sch.unroll(lo)
        sch.unroll(v)
    if per_row > 1:  # one position a row leaves no loop over them
        sch.unroll(sch.get_loops(k_row)[-4])
    sch.vectorize(sch.get_loops(k_row)[-1])
    _spread(sch, sch.fuse(*sch.get_loops(q_smem)[-2:]), rows, lanes, vector)
    sch.set_scope(b_score, 0, "shared")

    b_max = sch.get_sblock("chunk_max")
    _all_threads(sch, sch.get_loops(b_max)[-1], rows, lanes)
    sch.set_scope(b_max, 0, "shared")
    b_m = sch.get_sblock("max_out")
    sch.bind(sch.split(sch.get_loops(b_m)[-1], factors=[None, lanes])[1], "threadIdx.x")
    b_prob = sch.get_sblock("prob")
    _all_threads(sch, sch.get_loops(b_prob)[-1], rows, lanes)
    sch.set_scope(b_prob, 0, "shared")
    b_sum = sch.get_sblock("sum_out")
    _all_threads(sch, sch.get_loops(b_sum)[-1], rows, lanes)

    b_acc = sch.get_sblock("acc_out")
    g, d, t = sch.get_loops(b_acc)[-3:]
    halves = cfg.model.head_dim // (lanes * vector)  # rows per V row
    to, pg, p = sch.split(t, factors=[None, rows // halves, positions])
    rf = sch.rfactor(pg, 0)
    g, d, to, pg, p = sch.get_loops(rf)[-5:]
    dh, tx, v = sch.split(d, factors=[halves, lanes, vector])
    sch.reorder(pg, dh, tx, to, g, p, v)
    sch.bind(sch.fuse(pg, dh), "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.reorder(p, g)  # a V row's vector, read once from global memory, serves the G query heads
    sch.unroll(p)
    sch.unroll(g)
    sch.vectorize(v)
    _unroll_rows(sch, to)
    partial = sch.cache_write(rf, 0, "local")
    sch.set_scope(partial, 0, "shared")
    sch.reverse_compute_at(partial, tx)
    sch.vectorize(sch.get_loops(partial)[-1])
    sch.decompose_reduction(rf, to)

    g, d, w = sch.get_loops(b_acc)[-3:]
    _, ty, tx, v = sch.split(sch.fuse(g, d), factors=[None, rows, lanes, vector])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.unroll(v)
    return b_acc


def cuda(
    sch: s_tir.Schedule,
    cfg: DecodeConfig,
    split: bool = False,
    warps: int | None = None,
    positions: int | None = None,
    lanes: int | None = None,
    vector: int = 4,
    gpu: GpuSpec = DEFAULT_GPU,
) -> None:
    """warps: warps per CTA (default: `cuda_warps` for `gpu`); positions: positions per warp step (default 8 unsplit,
    the knob-grid winner of all 8 unsplit workloads on the H200, 1.06-1.18x over 4; 4 split); lanes: threads that
    reduce one score over D (32: a warp a position; 8, split only: a warp scores 4 positions at once with 3 shuffle
    levels instead of 5, a thread holding `D / (lanes*vector)` vectors of a K row, 8 float4 at D = 256 instead of 2;
    default 8 for split, the knob-grid winner of all 3 B=1 workloads on the H200, 1.23-1.50x over 32); vector:
    elements per load (4 = 16 bytes). Default warps and positions shrink to short chunks (`_fit_chunk`)."""
    fixed = (warps is not None, positions is not None)
    warps = cuda_warps(cfg, split, warps, vector, gpu)
    positions = positions or (4 if split else 8)
    lanes = lanes or (SPLIT_LANES if split else WARP)
    warps, positions = _fit_chunk(cfg, warps, positions, lanes, vector, fixed)
    _check_lanes(cfg, split, positions, lanes, vector)
    outer = sch.get_sblock(_outer(split))
    bx = sch.fuse(*sch.get_loops(outer)[:-1])
    sch.bind(bx, "blockIdx.x")
    sch.annotate(bx, "pragma_unroll_explicit", 0)  # unrolled loops hold allreduces: leave unrolling to nvcc
    b_acc = _cuda_chunk(sch, cfg, warps, positions, lanes, vector)
    if not split:
        _cuda_merge(sch, b_acc, warps, vector)


def _outer(split: bool) -> str:
    """The SBlock of one CTA's work: per (lane, kv head, split) or per (lane, kv head)."""
    return "split" if split else "unsplit"


def _fit_chunk(
    cfg: DecodeConfig, warps: int, positions: int, lanes: int, vector: int, fixed: tuple[bool, bool]
) -> tuple[int, int]:
    """`(warps, positions)` whose step of `warps * positions` rows divides `split_len`: the defaults (not `fixed`)
    halved until it does, warps down to `D / (32 * vector)` (the fewest whose rows cover a V row), then positions
    down to `32 / lanes`. A step past the chunk is refused: TVM stores each row's score after the shuffle reduction
    without the predicate of the rows past the chunk, so they would write outside its scores (into the next query
    head's, or past the buffer: wrong results at `split_len` 16 with 16 warps of 8 positions)."""
    least_warps, least_positions = cfg.model.head_dim // (WARP * vector), WARP // lanes
    while cfg.split_len % (warps * positions) and not fixed[0] and warps > least_warps:
        warps //= 2
    while cfg.split_len % (warps * positions) and not fixed[1] and positions > least_positions:
        positions //= 2
    if cfg.split_len % (warps * positions):
        raise ValueError(
            f"decode_attention: warps={warps} x positions={positions} rows a step must divide split_len="
            f"{cfg.split_len} (rows past the chunk would store their scores out of place)"
        )
    return warps, positions


def _check_lanes(cfg: DecodeConfig, split: bool, positions: int, lanes: int, vector: int) -> None:
    """`lanes` 32, or 8 for split; a whole number of positions per row and of rows per V row."""
    if lanes not in (8, WARP) or (lanes != WARP and not split):
        raise ValueError(f"decode_attention {_outer(split)}: lanes={lanes}, must be 32 (or 8 for split)")
    if positions * lanes % WARP or cfg.model.head_dim % (lanes * vector):
        raise ValueError(
            f"decode_attention lanes={lanes}: positions={positions} must be a multiple of {WARP // lanes} and "
            f"lanes*vector={lanes * vector} must divide D={cfg.model.head_dim}"
        )


def _cuda_merge(sch: s_tir.Schedule, b_acc, warps: int, vector: int) -> None:
    """unsplit: chunk partials and running state in shared memory; per-element blocks on all threads,
    per-head blocks on lanes."""
    sch.set_scope(b_acc, 0, "shared")
    for name in ("max_out", "sum_out", "init_acc", "merge_acc", "merge_stats"):
        for index in range(len(sch.get(sch.get_sblock(name)).writes)):
            sch.set_scope(sch.get_sblock(name), index, "shared")
    sch.set_scope(sch.get_sblock("init_stats"), 0, "shared")
    sch.set_scope(sch.get_sblock("init_stats"), 1, "shared")
    for name in ("init_acc", "merge_acc", "store_acc", "normalize"):
        _spread(sch, sch.fuse(*sch.get_loops(sch.get_sblock(name))[-2:]), warps, WARP, vector)
    for name in ("init_stats", "merge_stats", "store_stats"):
        loop = sch.get_loops(sch.get_sblock(name))[-1]
        sch.bind(sch.split(loop, factors=[None, WARP])[1], "threadIdx.x")


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, split: bool = False, vector: int = 8) -> None:
    """Parallel over (lane, kv head[, split]); inside a chunk the q.k dot products are rfactor-ed into `vector`
    partial sums (vectorised along D) and the V accumulation runs position-outer, D-inner, so both caches stream
    contiguously."""
    sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock(_outer(split)))[:-1]))
    *_, d = sch.get_loops(sch.get_sblock("score"))
    _, d_in = sch.split(d, factors=[None, vector])
    sch.vectorize(sch.get_loops(sch.rfactor(d_in, factor_axis=0))[-1])
    *_, d, t = sch.get_loops(sch.get_sblock("acc_out"))
    sch.reorder(t, d)
