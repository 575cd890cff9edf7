"""per_head_rmsnorm schedules: lanes per head, the row held in registers between the reduction and the scaling."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .common import _lane_split, cuda_head_norm, llvm_head_norm

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"heads_per_block": (1, 2, 4), "threads_per_head": (32, 64)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, vector: int = 8) -> None:
    """Heads in parallel; the reduction serial and the scaling vectorised within a head."""
    sch.compute_inline(sch.get_sblock("gather"))
    llvm_head_norm(sch, "sumsq", "norm", vector)


def cuda(
    sch: s_tir.Schedule, cfg: DecodeConfig, heads_per_block: int = 1, threads_per_head: int = 32, vector: int = 4
) -> None:
    """Grid B*(Hq+Hkv)/heads_per_block, block (threads_per_head, heads_per_block): a warp per head by default.

    Each lane gathers its `D/(threads_per_head*vector)` coalesced float4s of the q or k head into
    registers, the sum of squares is a warp-shuffle allreduce, and the lane scales and stores them.
    """
    cuda_head_norm(sch, "sumsq", "norm", (), heads_per_block, threads_per_head, vector)
    gather = sch.get_sblock("gather")
    sch.compute_at(gather, sch.get_loops(sch.get_sblock("norm"))[1])
    sch.set_scope(gather, 0, "local")
    _lane_split(sch, sch.get_loops(gather)[-1], threads_per_head, vector, vectorize=True)
