"""gemm schedules: llvm only (CUDA runs cuBLAS, `gdn_tvm.runtime.cublas`)."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, proj: str, vector: int = 8) -> None:
    """Rows of w in parallel; per row both halves of every lane, `vector`-wide partial sums along K in registers;
    then each output's sums of the halves (a block named as the output: `y`, or a stack's parts), its (lane, column)
    pairs in parallel."""
    outs = [param.name for param in sch.mod["main"].params[2:]]  # after w and xs
    blk = sch.get_sblock("gemm")
    *_, k = sch.get_loops(blk)
    _, kv = sch.split(k, factors=[None, vector])
    rf = sch.rfactor(kv, factor_axis=3)  # partial sums [2, B, N, vector]
    s, b, n, ko, kv = sch.get_loops(rf)
    sch.reorder(n, s, b, ko, kv)
    sch.parallel(n)
    sch.reverse_compute_at(blk, b)
    sch.set_scope(rf, 0, "local")
    sch.vectorize(kv)
    sch.decompose_reduction(rf, ko)
    for name in outs:
        b, n, _ = sch.get_loops(sch.get_sblock(name))
        sch.parallel(sch.fuse(b, n))
