"""gated_rmsnorm schedules: one reduction per value head of Dv."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .common import cuda_head_norm, llvm_head_norm

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"heads_per_block": (1, 2, 4), "threads_per_head": (32, 64)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    llvm_head_norm(sch, "sumsq", "norm")


def cuda(
    sch: s_tir.Schedule, cfg: DecodeConfig, heads_per_block: int = 2, threads_per_head: int = 32, vector: int = 4
) -> None:
    """Grid: B*Hv / heads_per_block CTAs of (threads_per_head, heads_per_block) threads; o and z loaded once
    into registers; o, z, w loaded and y stored `vector`-wide."""
    cuda_head_norm(sch, "sumsq", "norm", ("o", "z"), heads_per_block, threads_per_head, vector)
