"""split_bf16 schedules: element-wise."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .common import cuda_elementwise, llvm_elementwise

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (64, 128, 256)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, width: str) -> None:
    llvm_elementwise(sch, "split")


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, width: str, threads: int = 128, vector: int = 4) -> None:
    cuda_elementwise(sch, "split", threads, vector)
