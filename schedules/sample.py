"""sample schedules: one lane a CTA; every pass over the lane's logits a CTA-wide allreduce."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"threads": (256, 512, 1024)}
# The passes over a lane's row (reductions over the vocabulary), then the blocks whose per-lane values they write.
PASSES = ("max", "argmax", "topk_count", "topk_mass", "topp_mass", "kept_mass", "last", "cdf_mass")
SCALARS = (
    *("topk_carry", "topk_step", "topp_carry", "topp_step"),
    *("philox_carry", "philox_round", "cdf_carry", "cdf_step"),
)


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """As written: lanes one after another, each pass a serial loop."""


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 1024) -> None:
    """Grid B, `threads` threads a CTA. A pass strides the row, thread `t` reading logits `t, t + threads, ...`
    (coalesced), and ends in an allreduce that leaves its result in every thread's registers; the steps between
    passes (a search's next bit, the Philox rounds) run in every thread alike on those registers."""
    cuda_passes(sch, PASSES, threads)
    for name in SCALARS:
        sch.set_scope(sch.get_sblock(name), 0, "local")


def cuda_passes(sch: s_tir.Schedule, passes: tuple[str, ...], threads: int) -> None:
    """The lane loop (around block "max") on blockIdx.x; each of `passes` strided over `threads` threads, its result
    in registers."""
    sch.bind(sch.get_loops(sch.get_sblock("max"))[0], "blockIdx.x")
    for name in passes:
        block = sch.get_sblock(name)
        _, tx = sch.split(sch.get_loops(block)[-1], factors=[None, threads])
        sch.bind(tx, "threadIdx.x")
        sch.set_scope(block, 0, "local")
