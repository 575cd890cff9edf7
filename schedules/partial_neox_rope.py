"""partial_neox_rope schedules: a warp per head, one lane per rotated pair, the other dims a float4 copy."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"heads_per_block": (1, 2, 4)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, indirect: bool = False, vector: int = 8) -> None:
    """cos/sin once per lane and pair; heads in parallel, pairs and copied dims vectorised."""
    rotate, copy = sch.get_sblock("rotate"), sch.get_sblock("copy")
    b, h, i = sch.get_loops(rotate)
    sch.parallel(sch.fuse(b, h))
    sch.vectorize(sch.split(i, factors=[None, vector])[1])
    sch.vectorize(sch.split(sch.get_loops(copy)[-1], factors=[None, vector])[1])


def cuda(
    sch: s_tir.Schedule, cfg: DecodeConfig, indirect: bool = False, heads_per_block: int = 1, vector: int = 4
) -> None:
    """Grid (B*(Hq+Hkv)/heads_per_block), block (32, heads_per_block): a warp per head.

    Lane i computes cos/sin of pair i in float64 (registers), rotates (x_i, x_{i+n_rot/2}) with
    coalesced scalar loads, then the warp copies the `D - n_rot` other dims as float4s.
    """
    angle, rotate, copy = (sch.get_sblock(n) for n in ("angle", "rotate", "copy"))
    b, h, i = sch.get_loops(rotate)
    bx, ty = sch.split(sch.fuse(b, h), factors=[None, heads_per_block])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    _lanes(sch, i)
    d, v = sch.split(sch.get_loops(copy)[-1], factors=[None, vector])
    _lanes(sch, d)
    sch.vectorize(v)
    sch.compute_at(angle, ty)
    _lanes(sch, sch.get_loops(angle)[-1])
    for buffer_index in (0, 1):
        sch.set_scope(angle, buffer_index, "local")


def _lanes(sch: s_tir.Schedule, loop) -> None:
    """Split `loop` over the 32 lanes of threadIdx.x."""
    sch.bind(sch.split(loop, factors=[None, 32])[1], "threadIdx.x")
