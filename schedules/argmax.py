"""argmax schedules: a CTA per (lane, chunk), the lane's last chunk to finish also reducing the chunk results; each
reduction a threads-wide allreduce."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples: the CTA width. H200, V = 248,320, graph-replayed from L2 (two launches then, the
# second a warp a lane): B=1 3.5 / 3.3 / 3.0 us, B=32 12.8 / 19.0 / 23.6 us (one CTA a lane before: 42.7 and 44.8);
# one launch (the last arrival merging), B=1: 3.56 us at 128, the wider ones slower.
KNOBS = {"threads": (128, 256, 512)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """Lanes in parallel, a lane's chunks one after another (`arrive` on the CPU: the last chunk is the last to
    arrive), each chunk's passes serial."""
    sch.parallel(sch.get_loops(sch.get_sblock("chunk_out"))[0])


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, threads: int = 128) -> None:
    """Grid B x C, `threads` threads a CTA, both passes over the chunk strided (thread `t` reads its logits `t, t +
    threads, ...`: coalesced), the chunk max in registers; the last chunk's CTA reduces the lane's C chunk results the
    same way."""
    sch.bind(sch.fuse(*sch.get_loops(sch.get_sblock("chunk_out"))), "blockIdx.x")
    for name in ("chunk_max", "chunk_first", "row_max", "row_first"):
        block = sch.get_sblock(name)
        _, tx = sch.split(sch.get_loops(block)[-1], factors=[None, threads])
        sch.bind(tx, "threadIdx.x")
        sch.set_scope(block, 0, "local")
    sch.set_scope(sch.get_sblock("arrive"), 0, "local")
