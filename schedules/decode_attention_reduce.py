"""decode_attention_reduce schedules.

CUDA: one CTA per (lane, head, chunk of D) (the definition's `reduce_layout`), split groups on threadIdx.y, float4s
of the chunk on threadIdx.x. LLVM: (lane, head, chunk) in parallel.
"""

from __future__ import annotations

import math

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times: the defaults alone.
KNOBS = {"unroll": (8,)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """(lane, head, chunk of D) in parallel; the merge inside as written."""
    sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("reduce"))[:-1]))


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, vector: int = 4, unroll: int = 8) -> None:
    """One CTA per (lane, head, chunk of D): threadIdx.y is the split group, threadIdx.x owns a `vector`-wide
    piece of the chunk (vector: elements per load, 4 = 16 bytes; unroll: splits combined per unrolled step).

    Each thread computes its group's max and denominator itself (a few scalars; every thread of the group writes
    the same value to shared memory) and accumulates its pieces of the group's numerator in registers over the
    group's splits, `unroll` splits per unrolled step, so groups x unroll loads are in flight per element. After a
    barrier each thread merges the groups: max and denominator per thread, numerator and output on the threads of
    group 0 (one vector each)."""
    sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock("reduce"))[:-1]), "blockIdx.x")
    for name in ("part_max", "part_den"):
        blk = sch.get_sblock(name)
        g, i = sch.get_loops(blk)[-2:]
        sch.bind(g, "threadIdx.y")
        io, ii = sch.split(i, factors=[None, _unroll(sch, i, unroll)])
        sch.unroll(ii)
        write_back = sch.cache_write(blk, 0, "local")  # a register over the loop, then one shared store
        sch.set_scope(write_back, 0, "shared")
        sch.reverse_compute_at(write_back, g)
        sch.decompose_reduction(blk, io)

    blk = sch.get_sblock("part_num")
    g, d, i = sch.get_loops(blk)[-3:]
    groups = int(sch.get(g).extent)
    sch.bind(g, "threadIdx.y")
    threads = int(sch.get(d).extent) // vector
    dl, tx, v = sch.split(d, factors=[None, threads, vector])
    io, ii = sch.split(i, factors=[None, _unroll(sch, i, unroll)])
    sch.reorder(tx, dl, io, ii, v)
    sch.bind(tx, "threadIdx.x")
    sch.unroll(ii)
    sch.vectorize(v)
    write_back = sch.cache_write(blk, 0, "local")  # registers; the write-back fills the shared pnum
    sch.set_scope(write_back, 0, "shared")
    sch.reverse_compute_at(write_back, tx)
    sch.vectorize(sch.get_loops(write_back)[-1])
    sch.decompose_reduction(blk, io)

    for name in ("max", "den"):
        sch.set_scope(sch.get_sblock(name), 0, "local")
    b_norm = sch.get_sblock("normalize")
    _, ty, tx, v = sch.split(sch.get_loops(b_norm)[-1], factors=[None, groups, threads, vector])  # predicated
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)
    b_num = sch.get_sblock("num")
    sch.compute_at(b_num, tx)
    sch.set_scope(b_num, 0, "local")
    sch.reorder(*sch.get_loops(b_num)[-2:][::-1])  # groups outer, the vector inner
    sch.vectorize(sch.get_loops(b_num)[-1])


def _unroll(sch: s_tir.Schedule, loop, unroll: int) -> int:
    """The unroll factor of a reduce loop over a group's splits (a fixed extent): the largest divisor of it that
    divides `unroll`, so no unrolled step needs a guard and its loads issue unconditionally."""
    return math.gcd(unroll, int(sch.get(loop).extent))
