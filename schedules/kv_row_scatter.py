"""kv_row_scatter schedules: a vectorised copy into the cache rows."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .common import cuda_elementwise, llvm_elementwise, per_load

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (32, 64, 128)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    llvm_elementwise(sch, "scatter")


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 32, vector: int | None = None) -> None:
    """One 16-byte store of k and one of v per thread (default `vector`: a float4, or 8 bf16 from two float4s
    rounded in registers); B*Hkv*D/(vector*threads) CTAs (4 at B=1, Hkv=2 in float32)."""
    cuda_elementwise(sch, "scatter", threads, vector or per_load(cfg.kv_dtype))
