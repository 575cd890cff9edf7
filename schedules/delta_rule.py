"""delta_rule schedules: the state is streamed once (read into registers, updated, written back)."""

from __future__ import annotations

from tvm import s_tir

from gdn_tvm.config import DecodeConfig

# Block lists name the fused variant's blocks too (`_FUSED`: L2 norm and gates); `_blocks` drops them otherwise.
_FUSED = ("qk_raw", "qk_sumsq", "beta")
_LOCAL = ("qk_raw", "qk_sumsq", "qk_head", "decay", "beta", "state_load", "kq", "sk", "sq", "delta")  # registers
_ALONG_DK = ("qk_raw", "qk_sumsq", "qk_head", "state_load", "kq", "sk", "sq", "update")  # innermost loop along Dk
_VECTORISED = ("qk_raw", "qk_head", "state_load", "update")  # along Dk without an allreduce inside
_PER_HEAD = ("kq", "beta", "decay", "qk_head", "qk_sumsq", "qk_raw")  # computed once a CTA, consumers first

# The knob grid a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times. Rows of 4, 8 or 16 lanes
# (2-4 shuffle steps) measured within 1.7% of 32 lanes at B=1..256 in the H200 sweeps (h200_sweeps_delta.jsonl.xz,
# f9acedb): `lanes` is not sampled.
KNOBS = {"row_groups": (1, 2, 4, 8, 16), "rows_per_group": (1, 4, 8), "stores_last": (0, 1)}


def _row_nest(sch: s_tir.Schedule) -> tuple[s_tir.LoopRV, ...]:
    """Merge the row loops of "update" and "o" into one (b, h, i) nest; returns it and update's Dk loop."""
    upd, out = sch.get_sblock("update"), sch.get_sblock("o")
    sch.merge(sch.get_loops(upd)[2], sch.get_loops(out)[2])
    return tuple(sch.get_loops(upd))


# State rows (B * Hv * Dv) where the default design changes; the fused op keeps 8 x 4 up to `FUSED_ONE_WARP`.
FEW_ROWS, MANY_ROWS, FUSED_ONE_WARP = 2**15, 2**17, 2**19


def _defaults(cfg: DecodeConfig, fused: bool) -> tuple[int, int, int]:
    """Default (row_groups, rows_per_group, stores_last), from the H200 sweeps at qwen3.5-4b
    (benchmarks/results/h200_sweeps_delta.jsonl.xz): below `FEW_ROWS` rows (4b B=1: 4k) one row a warp, 8 a CTA, enough
    CTAs to fill the GPU; from there to `MANY_ROWS` (B=8: 32k) 4 groups of 8 rows, which spreads the per-CTA work (q and
    k, kq, the fused variant's norms and gates) over 32 rows: the fused op at B=8 took 10.88 us against 13.61 for 8 x 1
    (rows stamped f9acedb). From `MANY_ROWS` (B=32: 128k) one warp of 8 rows storing them last, fla's CTA and order:
    35.96, 133.64 and 263.98 us at B=32, 128 and 256 against 36.95, 138.17 and 272.62 for 8 x 4; the fused op, whose
    per-CTA norms and gates a one-warp CTA repeats for every 8 rows, takes it from `FUSED_ONE_WARP` (B=128: 135.0 and
    264.7 against 135.6 and 268.5 us; 37.0 against 36.6 at B=32). A bf16 state row is half the bytes, so a CTA keeps
    more rows in flight: 2 groups of 4 rows below `FEW_ROWS`, then 4 groups of 8 at every size, both ops (rows stamped
    25a7e4d, us: `delta_rule` B=1 2.16 against 2.26 for 8 x 1, B=32 20.8 and B=128 73.1 against 22.5 and 76.4 for
    one warp of 8 rows storing last, B=8 the same design; the fused op 22.2 and 79.0 against 23.7 and 79.2 at B=32 and
    128, B=1 2.52 to 2.62 for every design of 4 or 8 rows a CTA). 8 groups of 8 rows were 2% faster for `delta_rule`
    at B=128 and 256 (71.9 and 139.8 us) but slower for the fused op (80.5 at B=128): one design for both."""
    rows = cfg.batch * cfg.model.n_v_heads * cfg.model.head_v_dim
    if cfg.state_dtype == "bfloat16":
        design = (2, 4, 0) if rows < FEW_ROWS else (4, 8, 0)
    elif rows < FEW_ROWS:
        design = (8, 1, 0)
    elif rows < MANY_ROWS:
        design = (4, 8, 0)
    else:
        design = (1, 8, 1) if not fused or rows >= FUSED_ONE_WARP else (8, 4, 0)
    return design if cfg.model.head_v_dim % (design[0] * design[1]) == 0 else (8, 1, 0)


def _read_early(sch: s_tir.Schedule, bx: s_tir.LoopRV, ty: s_tir.LoopRV, fused: bool) -> None:
    """Register copies of what the row loop reads from global memory: the lane's slot and (unfused) beta once a CTA,
    the v_i of a row group once a thread, read where the state rows are. The state is aliased, so nothing moves a
    load past a store: read in the loop, each row waited a load latency behind the previous row's store (H200, 4b:
    B=8 11.44 -> 10.96 us, the fused op at B=32..256 3% faster; `h200_sweeps_delta.jsonl.xz`: after, the rows stamped
    d1c7f33; before, rows pruned from the file, in its git history)."""
    slots = sch.cache_read("state_load", "slots", "local", consumer_blocks=["state_load", "update", "o"])
    sch.compute_at(slots, bx, preserve_unit_loops=True)
    v = sch.cache_read("delta", "qkv", "local", consumer_blocks=["delta"])
    sch.compute_at(v, ty, preserve_unit_loops=True)
    sch.unroll(sch.get_loops(v)[-1])
    if not fused:
        sch.compute_at(sch.cache_read("delta", "beta", "local"), bx, preserve_unit_loops=True)


def _blocks(names: tuple[str, ...], fused: bool) -> tuple[str, ...]:
    """`names` that the variant's definition has."""
    return names if fused else tuple(n for n in names if n not in _FUSED)


def llvm(sch: s_tir.Schedule, cfg: DecodeConfig, fused: bool = False, vector: int = 8) -> None:
    """Parallel over (lane, value head); per state row every stage at the row loop, vectorised along Dk."""
    b, h, i, _ = _row_nest(sch)
    bh = sch.fuse(b, h)
    sch.parallel(bh)
    for name in ("delta", "sq", "sk", "state_load"):
        sch.compute_at(sch.get_sblock(name), i)
    for name in _blocks(_PER_HEAD, fused):
        sch.compute_at(sch.get_sblock(name), bh)
    for name in _blocks(_VECTORISED, fused):
        _, v = sch.split(sch.get_loops(sch.get_sblock(name))[-1], factors=[None, vector])
        sch.vectorize(v)


def cuda(
    sch: s_tir.Schedule,
    cfg: DecodeConfig,
    fused: bool = False,
    row_groups: int | None = None,
    rows_per_group: int | None = None,
    lanes: int = 32,
    vector: int = 4,
    stores_last: int | None = None,
) -> None:
    """One CTA per `row_groups * rows_per_group` state rows of one (lane, value head): B*Hv*Dv/rows CTAs.

    threadIdx.y = row group, threadIdx.x = `lanes` threads along Dk; lane j owns columns `vector*j + lanes*vector*t`
    (float4 at vector 4), so each warp instruction reads `lanes*vector` contiguous columns of its rows (one 512-byte row
    at lanes*vector = Dk). A thread first loads its slice of all `rows_per_group` rows of its group into registers
    (every load in flight before any store), with the lane's slot and beta and the group's v_i (`_read_early`), then per
    row: shuffle allreduces of S_i.k and S_i.q over the lanes, d_i, the updated slice stored by the thread that loaded
    it (so the aliased state is safe), o_i by lane 0. q and k of the head are loaded into registers once per thread and
    kq is reduced once per thread; fused, so are the sums of squares of q and k (shuffle allreduces like kq) and the
    gates. Defaults: `_defaults`. `stores_last`: every row's allreduces and d_i first, then the rows stored back to back
    with their o_i, as fla orders its kernel (H200 ncu at 4b B=256, 8 x 4 rows: fla 4.19 TB/s of DRAM, this schedule
    3.92). With one warp of 8 rows it is 3% faster from B=32 (`_defaults`)."""
    m = cfg.model
    default_groups, default_per_group, default_last = _defaults(cfg, fused)
    if row_groups is None or rows_per_group is None:
        row_groups, rows_per_group = default_groups, default_per_group
    if stores_last is None:
        stores_last = default_last
    if m.head_k_dim % (lanes * vector) or m.head_v_dim % (row_groups * rows_per_group):
        raise ValueError(
            f"delta_rule cuda knobs: lanes*vector={lanes * vector} must divide Dk={m.head_k_dim} and "
            f"row_groups*rows_per_group={row_groups * rows_per_group} must divide Dv={m.head_v_dim}"
        )
    b, h, i, _ = _row_nest(sch)
    rb, ty, ri = sch.split(i, factors=[None, row_groups, rows_per_group])
    bx = sch.fuse(b, h, rb)
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    if stores_last:  # every row's d_i first (a loop of its own), then the rows stored back to back
        for name in ("delta", "sq", "sk"):
            sch.compute_at(sch.get_sblock(name), ty, preserve_unit_loops=True)
        reduce_rows = sch.merge(
            *(sch.get_loops(sch.get_sblock(n))[-2] for n in ("sk", "sq")), sch.get_loops(sch.get_sblock("delta"))[-1]
        )
    else:
        reduce_rows = ri
        sch.compute_at(sch.get_sblock("delta"), ri)
        for name in ("sq", "sk"):  # both allreduces first: independent, and their results live at once
            sch.compute_at(sch.get_sblock(name), ri, index=-2)
    sch.compute_at(sch.get_sblock("state_load"), ty, preserve_unit_loops=True)
    for name in _blocks(_PER_HEAD, fused):
        sch.compute_at(sch.get_sblock(name), bx, preserve_unit_loops=True)
    _read_early(sch, bx, ty, fused)
    for name in _blocks(_LOCAL, fused):
        sch.set_scope(sch.get_sblock(name), 0, "local")
    for name in _blocks(_ALONG_DK, fused):
        blk = sch.get_sblock(name)
        steps, lane, vec = sch.split(sch.get_loops(blk)[-1], factors=[None, lanes, vector])
        sch.reorder(lane, steps)
        sch.bind(lane, "threadIdx.x")
        if name in _VECTORISED:  # no allreduce inside: explicit unrolls are safe
            sch.vectorize(vec)
            sch.unroll(steps)
        if name in ("qk_raw", "qk_head", "state_load"):  # all rows (q and k) loaded together, into registers
            sch.unroll(sch.get_loops(blk)[-4])
    sch.unroll(reduce_rows)  # holds the allreduces, which must not be duplicated before lowering: nvcc unrolls it
    sch.annotate(reduce_rows, "pragma_unroll_explicit", 0)
    if stores_last:
        sch.unroll(ri)
