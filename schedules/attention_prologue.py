"""attention_prologue schedules: a warp per head (q or k), its normalised row in shared memory for the rotation."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"heads_per_block": (1, 2, 4)}
WARP = 32


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig) -> None:
    """(lane, head) in parallel, each head's blocks serial."""
    b, h, _ = sch.get_loops(sch.get_sblock("rotate"))
    sch.parallel(sch.fuse(b, h))


def cuda(sch: s_tir.Schedule, cfg: DecodeConfig, heads_per_block: int = 1) -> None:
    """Grid B*(Hq+Hkv)/heads_per_block, block (32, heads_per_block): a warp per head.

    The warp's lanes stride the head: its sum of squares is a warp-shuffle allreduce, its normalised row goes to
    shared memory, lane i rotates pair i (its cos/sin in float64, in registers), and the lanes copy the dims past
    n_rot, the gate half or the v row.
    """
    b, h, i = sch.get_loops(sch.get_sblock("rotate"))
    bx, ty = sch.split(sch.fuse(b, h), factors=[None, heads_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    for name in ("sumsq", "norm", "rotate", "copy", "pass"):
        _lanes(sch, sch.get_loops(sch.get_sblock(name))[-1])
    sch.set_scope(sch.get_sblock("sumsq"), 0, "local")
    sch.set_scope(sch.get_sblock("norm"), 0, "shared")
    angle = sch.get_sblock("angle")
    sch.compute_at(angle, ty)
    _lanes(sch, sch.get_loops(angle)[-1])
    for buffer_index in (0, 1):
        sch.set_scope(angle, buffer_index, "local")


def _lanes(sch: s_tir.Schedule, loop) -> None:
    """Split `loop` over the 32 lanes of threadIdx.x."""
    sch.bind(sch.split(loop, factors=[None, WARP])[1], "threadIdx.x")
