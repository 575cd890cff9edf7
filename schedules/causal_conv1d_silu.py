"""causal_conv1d_silu schedules: element-wise over (lane, channel); each channel's state row is Kc-1 floats."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (32, 64, 128, 256)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, vector: int = 8) -> None:
    """(lane, channel chunk) in parallel; y vectorised over the chunk, the rest computed per chunk."""
    (outer,) = _merged_chunks(sch, vector)
    sch.vectorize(sch.get_loops(sch.get_sblock("conv"))[-1])
    sch.parallel(outer)
    for name in ("dot", "shift"):
        sch.compute_at(sch.get_sblock(name), outer)


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 32, vector: int = 4) -> None:
    """Grid: B * C/(threads*vector) CTAs of `threads` threads; each thread owns `vector` channels of one lane.
    32 threads: the knob-grid winner of 3 of the 4 H200 workloads (1.10-1.16x over 64; the 4th kept 64).

    A thread loads its x, weight rows and state rows once into registers, `vector`-wide (at vector=4
    the 4 state rows are 12 contiguous floats: 3 float4), then writes y (one float4) and the shifted rows
    (3 float4) from registers, so every state element is read before the same thread overwrites it.
    """
    dot, shift = sch.get_sblock("dot"), sch.get_sblock("shift")
    caches = [
        sch.cache_read(dot, "state", "local", consumer_blocks=[dot, shift]),
        sch.cache_read(dot, "x", "local", consumer_blocks=[dot, shift]),
        sch.cache_read(dot, "weight", "local"),
    ]
    bx, tx = _merged_chunks(sch, vector, threads)
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(sch.get_loops(sch.get_sblock("conv"))[-1])
    for block in (dot, shift):
        sch.compute_at(block, tx)
        sch.set_scope(block, 0, "local")
        for loop in sch.get_loops(block)[2:]:
            sch.unroll(loop)
    for cache in caches:
        sch.compute_at(cache, tx)
        _vectorize_run(sch, cache, vector)
    _vectorize_run(sch, sch.get_sblock("store"), vector)


def _vectorize_run(sch: s_tir.Schedule, block: s_tir.schedule.SBlockRV, vector: int) -> None:
    """The block's loops under (blockIdx, threadIdx), one contiguous run per thread, fused and vectorised."""
    inner = sch.get_loops(block)[2:]
    if not inner:  # a single element (vector=1)
        return
    lo, lv = sch.split(sch.fuse(*inner) if len(inner) > 1 else inner[0], factors=[None, vector])
    sch.unroll(lo)
    sch.vectorize(lv)


def _merged_chunks(sch: s_tir.Schedule, vector: int, threads: int | None = None) -> list[s_tir.schedule.LoopRV]:
    """Split the channel loops of "conv" and "store" alike into (chunk, [thread,] vector), fuse the lane loop
    into the chunk loop and merge the two nests: returns the shared (chunk[, thread]) loops."""
    factors = [None, vector] if threads is None else [None, threads, vector]
    nests = []
    for name in ("conv", "store"):
        b, c, *_ = sch.get_loops(sch.get_sblock(name))
        chunk, *rest = sch.split(c, factors=factors)
        nests.append([sch.fuse(b, chunk), *rest[:-1]])
    return [sch.merge(*loops) for loops in zip(*nests, strict=True)]
