"""advance schedules: one lane per thread (a handful of scalars each)."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

KNOBS = {"threads": (32, 128)}  # the knob grid a tuner samples


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """Lanes in one serial loop: B scalar updates."""


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 32) -> None:
    """Lanes over (blocks, `threads` threads)."""
    (lanes,) = sch.get_loops(sch.get_sblock("advance"))
    bx, tx = sch.split(lanes, factors=[None, threads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
