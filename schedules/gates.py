"""gates schedules: B*Hv independent elements (tiny), one per thread."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (32, 64, 128)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    b = sch.get_sblock("gates")
    i, h = sch.get_loops(b)
    sch.parallel(i)
    sch.vectorize(h)


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 128) -> None:
    """Fused (B, Hv) split over `threads`-wide CTAs; the tail is predicated. 128 threads: the knob-grid winner of
    3 of the 4 H200 workloads (1.05-1.41x over 64; the 4th went to a searched design)."""
    b = sch.get_sblock("gates")
    bx, tx = sch.split(sch.fuse(*sch.get_loops(b)), factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
