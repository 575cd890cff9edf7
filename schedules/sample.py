"""sample schedules: a CTA per (lane, chunk) in the search launches, a CTA per lane in the last; every sum, max or min
over a chunk's logits or a lane's chunk results a CTA-wide allreduce."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times. H200, V = 248,320, 128 /
# 256 / 512 threads: 183 / 150 / 150 us at B=1, 973 / 584 / 428 at B=8, 4806 / 2368 / 1403 at B=32 (the op
# benchmark's mixed lanes; 256 CTAs a launch then, h200_sweeps_sample.jsonl.xz).
KNOBS = {"threads": (128, 256, 512)}
# The reductions over a chunk's logits or over a lane's C chunk results (all but `TO_WORKSPACE` into registers),
# and the blocks whose per-CTA values they write (each thread keeps them in registers).
PASSES = (
    *("chunk_max", "chunk_first", "topk_total", "topk_count", "row_max", "topk_mass"),
    *("topp_total", "zk_total", "topp_mass", "kept_mass", "last"),
    *("row_top", "row_first", "z_total", "chunk_below", "chunk_base", "cdf_mass"),
)
TO_WORKSPACE = ("topk_count", "topp_mass")  # a search step's sums, stored for the next launch
SCALARS = (
    *("topk_carry", "zk_carry", "topp_carry", "row_bounds"),
    *("philox_carry", "philox_round", "chunk_carry", "chunk_step", "cdf_carry", "cdf_step"),
)
LAUNCH_BLOCKS = ("chunk_out", "kept_out")  # a block under each chain loop's (launch, lane, chunk) loops


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """As written: launches, lanes and chunks one after another, each pass a serial loop."""


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 512) -> None:
    """Grid B x C in each search launch, B in the last, `threads` threads a CTA. A pass strides its chunk (thread `t`
    reading logits `t, t + threads, ...`: coalesced) or the lane's chunk results, and ends in an allreduce that
    leaves its result in every thread's registers; the steps between passes run in every thread alike on those
    registers, and every thread stores the same values to the workspace."""
    for name in LAUNCH_BLOCKS:
        _, b, c = sch.get_loops(sch.get_sblock(name))
        sch.bind(sch.fuse(b, c), "blockIdx.x")
    sch.bind(sch.get_loops(sch.get_sblock("token"))[0], "blockIdx.x")
    for name in PASSES:
        block = sch.get_sblock(name)
        _, tx = sch.split(sch.get_loops(block)[-1], factors=[None, threads])
        sch.bind(tx, "threadIdx.x")
        if name not in TO_WORKSPACE:
            sch.set_scope(block, 0, "local")
    for name in SCALARS:
        block = sch.get_sblock(name)
        for k in range(len(sch.get(block).writes)):
            sch.set_scope(block, k, "local")
