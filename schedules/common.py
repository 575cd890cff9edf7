"""Schedule pieces shared by the per-op rules."""

from __future__ import annotations

from tvm import s_tir


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
