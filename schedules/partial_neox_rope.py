"""partial_neox_rope schedules: a warp per head, one lane per rotated pair, the other dims a float4 copy."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig
from gdn_tvm.target import DEFAULT_GPU, GpuSpec

MANY_HEADS_PER_SM = 16  # (lane, head) warps an SM from which blocks of 4 heads share their angles

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times.
KNOBS = {"heads_per_block": (1, 2, 4, 0), "shared_angles": (False, True)}


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, vector: int = 8) -> None:
    """cos/sin once per lane and pair; heads in parallel, pairs and copied dims vectorised."""
    rotate, copy = sch.get_sblock("rotate"), sch.get_sblock("copy")
    b, h, i = sch.get_loops(rotate)
    sch.parallel(sch.fuse(b, h))
    sch.vectorize(sch.split(i, factors=[None, vector])[1])
    sch.vectorize(sch.split(sch.get_loops(copy)[-1], factors=[None, vector])[1])


def cuda(
    sch: s_tir.Schedule,
    cfg: DecodeConfig,
    heads_per_block: int | None = None,
    vector: int = 4,
    shared_angles: bool | None = None,
    gpu: GpuSpec = DEFAULT_GPU,
) -> None:
    """Grid (B*(Hq+Hkv)/heads_per_block), block (32, heads_per_block): a warp per head (heads_per_block 0: all
    Hq+Hkv heads of a lane in one block).

    Lane i computes cos/sin of pair i in float64 (registers), rotates (x_i, x_{i+n_rot/2}) with
    coalesced scalar loads, then the warp copies the `D - n_rot` other dims as float4s. With `shared_angles`
    the first warp computes a block's cos/sin once into shared memory for all its warps: the float64 pow, cos
    and sin are most of the work at large B, and every head of a lane shares them.

    Defaults: a warp a block, each evaluating its own angles; from `MANY_HEADS_PER_SM` warps an SM of `gpu`, 4 heads a
    block sharing them (H200 sweep at qwen3.5-4b B=256: 6.29 us against 7.41; at B=1 and B=32 within 3% of the
    default).
    """
    many = cfg.batch * (cfg.model.n_q_heads + cfg.model.n_kv_heads) >= MANY_HEADS_PER_SM * gpu.sms
    heads_per_block = (4 if many else 1) if heads_per_block is None else heads_per_block
    shared_angles = many if shared_angles is None else shared_angles
    heads = heads_per_block or cfg.model.n_q_heads + cfg.model.n_kv_heads
    angle, rotate, copy = (sch.get_sblock(n) for n in ("angle", "rotate", "copy"))
    b, h, i = sch.get_loops(rotate)
    bx, ty = sch.split(sch.fuse(b, h), factors=[None, heads])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    _lanes(sch, i)
    d, v = sch.split(sch.get_loops(copy)[-1], factors=[None, vector])
    _lanes(sch, d)
    sch.vectorize(v)
    if shared_angles:
        sch.compute_at(angle, bx)
        _, warp, lane = sch.split(sch.get_loops(angle)[-1], factors=[None, heads, 32])
        sch.bind(warp, "threadIdx.y")  # pairs beyond the first warp's 32 lanes: none for n_rot <= 64
        sch.bind(lane, "threadIdx.x")
        scope = "shared"
    else:
        sch.compute_at(angle, ty)
        _lanes(sch, sch.get_loops(angle)[-1])
        scope = "local"
    for buffer_index in (0, 1):
        sch.set_scope(angle, buffer_index, scope)


def _lanes(sch: s_tir.Schedule, loop) -> None:
    """Split `loop` over the 32 lanes of threadIdx.x."""
    sch.bind(sch.split(loop, factors=[None, 32])[1], "threadIdx.x")
