"""add_rmsnorm schedules: a lane's row held in registers between the add, the reduction and the scaling."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .common import _lane_split, cuda_head_norm, llvm_elementwise, llvm_head_norm

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (32, 64, 128, 256)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, add: bool = True, vector: int = 8) -> None:
    """The add and the store element-wise passes around the norm: lanes in parallel, the reduction serial and the
    scaling vectorised within a lane."""
    llvm_head_norm(sch, "sumsq", "norm", vector)
    if add:
        for block in ("add", "store"):
            llvm_elementwise(sch, block, vector)


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, add: bool = True, threads: int = 128, vector: int = 4) -> None:
    """One CTA of `threads` threads per lane: each thread owns `vector`-wide chunks of the row (`hidden/(threads *
    vector)` of them) and adds them into registers (without `add`, loads x there); the sum of squares is a CTA-wide
    allreduce; the thread scales and stores its chunks, then stores its sums into the residual."""
    if add:  # one lane loop over the norm's and the store's row loops
        sch.merge(sch.get_loops(sch.get_sblock("norm"))[0], sch.get_loops(sch.get_sblock("store"))[0])
    cuda_head_norm(sch, "sumsq", "norm", () if add else ("x",), 1, threads, vector)
    if not add:
        return
    lane = sch.get_loops(sch.get_sblock("norm"))[1]
    h, store = sch.get_sblock("add"), sch.get_sblock("store")
    sch.compute_at(h, lane)
    sch.set_scope(h, 0, "local")
    for block in (h, store):
        _lane_split(sch, sch.get_loops(block)[-1], threads, vector, vectorize=True)
