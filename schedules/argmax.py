"""argmax schedules: the first stage a CTA per (lane, chunk), the second a warp per lane, each reduction a
threads-wide allreduce."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples: the first stage's CTA width. H200, V = 248,320, graph-replayed from L2: B=1 3.5 /
# 3.3 / 3.0 us, B=32 12.8 / 19.0 / 23.6 us (one CTA a lane before: 42.7 and 44.8).
KNOBS = {"threads": (128, 256, 512)}
WARP = 32  # the second stage's CTA width: a lane's C <= 256 chunk results, at most 8 a thread


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """(lane, chunk) in parallel, each chunk's two passes serial; the second stage as written."""
    sch.parallel(sch.fuse(*sch.get_loops(sch.get_sblock("chunk_out"))))


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 128) -> None:
    """Stage 1: grid B x C, `threads` threads a CTA, both passes over the chunk strided (thread `t` reads its logits
    `t, t + threads, ...`: coalesced), the chunk max in registers. Stage 2: grid B, a warp reducing the C chunks."""
    sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock("chunk_out"))), "blockIdx.x")
    _allreduce(sch, ("chunk_max", "chunk_first"), threads)
    sch.bind(sch.get_loops(sch.get_sblock("token"))[0], "blockIdx.x")
    _allreduce(sch, ("row_max", "row_first"), WARP)


def _allreduce(sch: s_tir.Schedule, blocks: tuple[str, ...], threads: int) -> None:
    """Each of `blocks`' reduce loop strided over `threads` threads (threadIdx.x), its result in registers."""
    for name in blocks:
        block = sch.get_sblock(name)
        _, tx = sch.split(sch.get_loops(block)[-1], factors=[None, threads])
        sch.bind(tx, "threadIdx.x")
        sch.set_scope(block, 0, "local")
