"""split_interleaved schedules: a vectorised copy into two outputs."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .common import cuda_elementwise, llvm_elementwise

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (32, 64, 128, 256)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    llvm_elementwise(sch, "split")


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 64, vector: int = 4) -> None:
    """One float4 of q and one of gate per thread; B*Hq*D/(4*threads) CTAs (16 at B=1, Hq=16)."""
    cuda_elementwise(sch, "split", threads, vector)
