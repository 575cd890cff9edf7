"""argmax schedules: one lane a CTA, each pass over its logits a CTA-wide allreduce (as `sample`'s first two)."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

from .sample import cuda_passes

KNOBS = {"threads": (256, 512, 1024)}  # the knob grid a tuner samples


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """As written: lanes one after another, each pass a serial loop."""


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 1024) -> None:
    """Grid B, `threads` threads a CTA, both passes strided over the row."""
    cuda_passes(sch, ("max", "argmax"), threads)
