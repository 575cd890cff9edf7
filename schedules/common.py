"""Schedule pieces shared by the per-op rules."""

from __future__ import annotations

import tvm
from tvm import s_tir

LOAD_BYTES = 16  # the widest load a CUDA thread issues (float4, uint4)
F32_PER_LOAD = 4


def per_load(dtype: str) -> int:
    """Elements of `dtype` in one `LOAD_BYTES` load: 4 float32, 8 bf16."""
    return LOAD_BYTES * 8 // tvm.runtime.DataType(dtype).bits


def vectorize_floats(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> None:
    """Vectorise a loop over float32 values in pieces of one 16-byte load (a longer loop's rest unrolled): TVM 0.27
    prints float32x8 as `ulonglong4`, whose arithmetic it writes as `make_ulonglong4` of 8 floats, which nvcc
    rejects."""
    extent = sch.get(loop).extent
    if int(extent) > F32_PER_LOAD:
        outer, loop = sch.split(loop, factors=[None, F32_PER_LOAD])
        sch.unroll(outer)
    sch.vectorize(loop)


def llvm_elementwise(sch: s_tir.Schedule, block: str, vector: int = 8) -> None:
    """Outer loops fused and parallel, innermost loop split by `vector` and vectorised."""
    b = sch.get_sblock(block)
    *outer, inner = sch.get_loops(b)
    io, iv = sch.split(inner, factors=[None, vector])
    sch.parallel(sch.fuse(*outer, io))
    sch.vectorize(iv)


def cuda_elementwise(sch: s_tir.Schedule, block: str, threads: int = 256, vector: int = 4) -> None:
    """All loops fused, split into (blocks, threads, vector lanes); 16-byte accesses at vector=4."""
    b = sch.get_sblock(block)
    fused = sch.fuse(*sch.get_loops(b))
    bx, tx, v = sch.split(fused, factors=[None, threads, vector])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.vectorize(v)


def llvm_head_norm(sch: s_tir.Schedule, reduce: str, apply: str, vector: int = 8) -> None:
    """Per-head norm (a reduction block feeding an apply block, both over `(*heads, d)`): heads in parallel,
    the reduction computed per head, the apply loop vectorised."""
    *outer, d = sch.get_loops(sch.get_sblock(apply))
    heads = sch.fuse(*outer)
    sch.parallel(heads)
    sch.vectorize(sch.split(d, factors=[None, vector])[1])
    sch.compute_at(sch.get_sblock(reduce), heads)


def cuda_head_norm(
    sch: s_tir.Schedule,
    reduce: str,
    apply: str,
    cached: tuple[str, ...],
    heads_per_block: int,
    threads_per_head: int,
    vector: int,
) -> None:
    """Per-head norm on CUDA: `threads_per_head` lanes (threadIdx.x) per head, `heads_per_block` heads
    (threadIdx.y) per CTA. Each lane owns `vector`-wide chunks of the head dim; the head-shaped inputs
    named in `cached` are loaded once into registers with `vector`-wide loads, the sum is an in-thread
    reduction plus a cross-lane (warp-shuffle) allreduce, then the apply block stores `vector`-wide."""
    b_apply, b_reduce = sch.get_sblock(apply), sch.get_sblock(reduce)
    *outer, d = sch.get_loops(b_apply)
    bx, ty = sch.split(sch.fuse(*outer), factors=[None, heads_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    _lane_split(sch, d, threads_per_head, vector, vectorize=True)
    sch.compute_at(b_reduce, ty)
    _lane_split(sch, sch.get_loops(b_reduce)[-1], threads_per_head, vector, vectorize=False)
    sch.set_scope(b_reduce, 0, "local")
    for name in cached:
        cache = sch.cache_read(b_apply, name, "local")
        sch.compute_at(cache, ty)
        _lane_split(sch, sch.get_loops(cache)[-1], threads_per_head, vector, vectorize=True)


def _lane_split(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV, threads: int, vector: int, vectorize: bool) -> None:
    """`loop` -> (threadIdx.x, serial, vector lanes): lane `t` owns elements `(i*threads + t)*vector + v`."""
    lo, tx, v = sch.split(loop, factors=[None, threads, vector])
    sch.reorder(tx, lo)
    sch.bind(tx, "threadIdx.x")
    sch.unroll(lo)
    if vectorize:
        sch.vectorize(v)
    else:
        sch.unroll(v)
