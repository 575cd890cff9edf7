"""gemv schedules: `y[b, n] = sum_k x[b, k] * w[n, k]`, each weight element read once for all B lanes.

With the conv epilogue (`conv=True`), the thread that owns a finished row runs its conv and shifts its state; with the
residual one (`residual=True`), it adds the row into the residual stream. With SwiGLU (`swiglu=True`), a thread reduces
gate row `n` and up row `I + n` together ("rows" count such pairs). The prologues (`norm`: gated RMSNorm per head,
`rmsnorm`: the decoder layer's RMSNorm of the whole row) stage x normalised, each CTA summing its lanes' squares first.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from tvm import s_tir

from gdn_tvm.config import DecodeConfig
from gdn_tvm.target import DEFAULT_GPU, GpuSpec

from . import mma
from .common import per_load, vectorize_floats


class TensorCoreLayout(NamedTuple):
    """A tensor-core GEMV layout (`tensor_core_layout`): a CTA covers `B / b_tiles` lanes in `warps_m` warps of
    `m_frags` 16-lane tiles and `warps_n * n_frags` 16-row tiles, `k_tiles * 16` columns a k step, `stages` steps in
    flight."""

    b_tiles: int
    warps_m: int
    m_frags: int
    warps_n: int
    n_frags: int
    k_tiles: int
    stages: int


MANY_LANES = 8  # from this many lanes on, each weight element feeds enough multiply-adds that float32 FLOPs bind
# There, a projection of >= 1024 rows takes at least 16 rows a CTA and one warp per group of 4 rows: the knob-grid
# winner of 6 of the 8 such B=32 workloads of qwen3.5-0.8b and -4b on the H200, 1.8-2.9x the former default of
# 64-256 threads a row where it differed (the other 2 were won by near neighbours).
WIDE_ROWS = 16
# From SMALL_LANES[0] to SMALL_LANES[1] - 1 lanes, a plain projection of fewer than SMALL_WEIGHTS weights (those a step
# keeps as GEMVs beside its library GEMMs: `plan.library_gemms`' bounds, which schedules may not import; a test holds
# them equal) takes one row a CTA and a warp a row (x
# from L2, no stage). H200, bf16 (h200_sweeps_gemv_small.jsonl.xz: 48 CUDA-core designs at B=4 and 8 of qwen3.5-0.8b
# down, out_proj, in_proj_z, in_proj_b, k_proj and -4b in_proj_b, k_proj): 1.00-1.28x the best design of each of the
# 14, where the layout above was 1.00-2.22x (4b in_proj_b at B=8: 3.74 us best, 4.30 this, 8.28 before).
SMALL_LANES = (4, 16)
SMALL_WEIGHTS = 1 << 22

# Tensor cores (`mma.sync`) for bf16 weights and whole 16-lane tiles: from TENSOR_CORE_LANES lanes, or from 16 on
# projections of at least TENSOR_CORE_ROWS rows (the LM head). qwen3.5-4b on the H200
# (benchmarks/results/h200_sweeps_tensor_cores.jsonl.xz): at B = 128 they beat the CUDA-core design on every GEMV
# (1.0-3.9x); at B = 32 only on the LM head (3.3x), the others losing up to 2.6x (too few warps in flight).
TENSOR_CORE_LANES = 128
TENSOR_CORE_ROWS = 65536
MANY_ROW_TILES = 4096  # from this many 16-row tiles, 4 lane tiles a warp (the LM head: 1.1x); else 1 (1.1-1.5x)
# k chunks in flight a CTA (`cp.async` copies of the next while the warps multiply this one): 2, or 1 from
# MANY_ROW_TILES row tiles. H200, qwen3.5-4b B=128 (h200_ops_bf16_pipelined.json): 2 stages took qkv 161 -> 151 us,
# down 317 -> 230, gate|up 394 -> 311, out_proj 142 -> 105; on the LM head the second buffer leaves room for half
# the rows a CTA, so x is read twice as often: 1,928 -> 3,691 us (587 -> 910 at B=32).
STAGES = 2
# Wide CTAs in dynamic shared memory by default, from TENSOR_CORE_LANES lanes. Warps along the lanes only
# (`_wide`: one lane tile and 4 row tiles a warp, 2 where 4 would leave fewer than half the SMs a CTA; up to 8 warps
# over 128 lanes), so each x fragment is split into bf16 hi and lo by one warp, not by every warp of its rows; the
# LM head, CTAs of up to 256 lanes x 128 rows (WIDE_LM_HEAD: 2 x 2 or 4 x 2 warps of 4 x 4 tiles). qwen3.5-4b bf16
# on the H200, us, the former defaults (h200_ops_bf16_wide.json) -> warps along the lanes
# (h200_sweeps_tensor_cores.jsonl.xz): B=128 qkv 91 -> 78, down 230 -> 190, out_proj 105 -> 86, gate|up 312 -> 280;
# B=256 qkv 160 -> 124, down 311 -> 263, out_proj 141 -> 118, gate|up 523 -> 414. The LM head, static ->
# WIDE_LM_HEAD: 1,941 -> 1,373 at B=128, 3,784 -> 2,902 at B=256.
WIDE_LM_HEAD = {"m_frags": 4, "warps_n": 2, "n_frags": 4}

# A prologue is recomputed by every CTA, so fewer, wider CTAs amortise it: (rows a CTA, rows a thread), a warp a row.
# The gated norm always (its per-head sums then warp allreduces: no CTA barrier a head), the rmsnorm where every SM
# still gets two CTAs and rows are at most PROLOGUE_COLS long. H200, bf16, B=1 (h200_sweeps_block_stages.jsonl.xz, us,
# plain-GEMV default -> this): qwen3.5-0.8b out_proj_norm_residual 8.50 -> 4.56, in_proj_rmsnorm_conv 8.54 -> 8.27;
# qwen3.5-4b in_proj_rmsnorm_conv 22.22 -> 19.70, gate_up_proj_rmsnorm_swiglu 26.85 -> 25.02, qkv_proj_rmsnorm
# 17.97 -> 16.25 (each the best of 29 designs or within 0.5% of it; 0.8b gate|up, 224 CTAs of 16 rows, keeps the
# plain default, its best). Beyond the swept K = 2560, at qwen3.5-9b's 4096 (one model run each,
# h200_model_prologue_layouts.json against h200_model_block_stages.json), in_proj lost (31.1 -> 34.3 us a launch)
# where qkv gained (25.7 -> 23.6): longer rows keep the plain layout until a sweep says otherwise.
PROLOGUE_ROWS = {"norm": (8, 1), "rmsnorm": (16, 2)}
PROLOGUE_COLS = 2560

# The knob grids a tuner samples (gdn_tvm/tuning/space.py) and benchmarks/sweep.py times: CUDA cores, then tensor
# cores (for bf16 weights and lanes in 16s; `n_frags`/`m_frags`: 16 x 16 tiles a warp holds along N / B): the CTA
# layouts at the default pipeline, and the pipeline (k chunk, stages) around the default layout: their product, 324
# designs, took minutes of H200 time a workload to measure.
KNOBS = (
    {
        "tensor_cores": (False,),
        "rows": (1, 2, 4, 8, 16),
        "threads_per_row": (16, 32, 64, 128),
        "rows_per_thread": (1, 2, 4),
        "unroll": (8,),
    },
    {
        "tensor_cores": (True,),
        "warps_n": (1, 2, 4),
        "n_frags": (1, 2, 4),
        "m_frags": (1, 2, 4),
        "dynamic_smem": (False, True),
    },
    {"tensor_cores": (True,), "k_tiles": (2, 4, 8), "stages": (1, 2, 3)},
)


def llvm(
    sch: s_tir.Schedule,
    cfg: DecodeConfig,
    proj: str,
    conv: bool = False,
    norm: bool = False,
    swiglu: bool = False,
    rmsnorm: bool = False,
    residual: bool = False,
    vector: int = 8,
    batch_tile: int = 4,
) -> None:
    """Rows in parallel; per row and B tile, `vector`-wide partial sums along K in registers, each w load
    serving the tile's lanes (the row of w stays in cache across tiles). The conv and residual epilogues: (lane, row)
    in parallel after the projection; the prologues: (lane, head) in parallel before it (rmsnorm: lanes); SwiGLU: a
    row's gate and up sums side by side, each x load serving both, and its lanes' outputs once both are done."""
    blk = sch.get_sblock("gemv")
    b, n, *pair, k = sch.get_loops(blk)
    ko, kv = sch.split(k, factors=[None, vector])
    rf = sch.rfactor(kv, factor_axis=2)  # partial sums [B, N, vector]: lanes contiguous
    b, n, *pair, ko, kv = sch.get_loops(rf)
    bo, bi = sch.split(b, factors=[None, _lane_tile(cfg.batch, batch_tile)])
    sch.reorder(n, bo, ko, bi, *pair, kv)
    sch.parallel(n)
    sch.reverse_compute_at(blk, bo)
    sch.set_scope(rf, 0, "local")
    sch.vectorize(kv)
    sch.decompose_reduction(rf, ko)
    if swiglu:
        sch.reverse_compute_at(sch.get_sblock("swiglu"), n)
    prologue = ("sumsq", "normed") if norm or rmsnorm else ()
    for name in prologue + (("conv", "store") if conv else ("residual",) if residual else ()):
        b, n, *_ = sch.get_loops(sch.get_sblock(name))
        sch.parallel(b if name == "sumsq" and rmsnorm else sch.fuse(b, n))  # rmsnorm's sums: (lane, K)


def cuda(
    sch: s_tir.Schedule,
    cfg: DecodeConfig,
    proj: str,
    conv: bool = False,
    norm: bool = False,
    swiglu: bool = False,
    rmsnorm: bool = False,
    residual: bool = False,
    rows: int | None = None,
    threads_per_row: int | None = None,
    vector: int | None = None,
    batch_tile: int = 16,
    smem_bytes: int = 24576,
    unroll: int = 8,
    rows_per_thread: int | None = None,
    tensor_cores: bool | None = None,
    warps_n: int | None = None,
    n_frags: int | None = None,
    m_frags: int | None = None,
    k_tiles: int | None = None,
    stages: int | None = None,
    dynamic_smem: bool | None = None,
    gpu: GpuSpec = DEFAULT_GPU,
) -> None:
    """Tensor cores where `uses_tensor_cores` (or `tensor_cores=True`): see `_cuda_tensor_cores`. Otherwise:

    One CTA per `rows` rows x one B tile; each row reduced by `threads_per_row` threads (warp shuffles).

    Threads read w with `vector`-wide coalesced loads along K (default 16 bytes: float4, or 8 bf16 as a uint4,
    converted to float32 in registers), `unroll` loads in flight; every w element read serves the B tile's lanes of
    x, staged in shared memory in K chunks of <= `smem_bytes` and moved in float4s.
    A thread owns `rows_per_thread` of its CTA's rows: each x vector it reads from shared memory then serves
    that many rows (with many lanes, shared-memory reads of x, not w, bound a one-row thread).
    Defaults: 256 threads a CTA, up to 8 rows a CTA while that keeps >= 2 CTAs per SM, B tiles of
    <= `batch_tile` lanes (fewer where the smem chunk would not hold them), 4 rows a thread from 8 lanes on;
    from 8 lanes on, projections of >= 1024 rows take `WIDE_ROWS` rows a CTA and 32 threads a row; from 4 to 15
    lanes, plain projections of fewer than `SMALL_WEIGHTS` weights one row a CTA and 32 threads a row.
    The conv epilogue: a row group's sums go to shared memory, then one thread per (lane, row) of the group
    writes its y and (conv rows) its state row. The norm prologue: the CTA first sums the squares of its lanes'
    heads into shared memory (a warp a head at a time), then stages each K chunk of x normalised and gated, where
    the plain GEMV stages x (at least 2 rows a CTA, so there is a stage). SwiGLU: the layout counts output rows,
    each a gate and an up row of w (a thread loads both per K step, and holds both sums); the group's sums go to
    shared memory, then one thread per (lane, row) writes `silu(gate) * up`. The rmsnorm prologue: the CTA's threads
    sum each lane's squares together, then stage x as the norm prologue does; the residual epilogue: as the conv one,
    each (lane, row) thread adding its sum into the stream.
    """
    if tensor_cores is None:
        tensor_cores = uses_tensor_cores(cfg, proj, conv, norm, swiglu, rmsnorm, residual)
    if tensor_cores:
        if conv or norm or rmsnorm or residual:
            raise ValueError("tensor cores: the conv, norm, rmsnorm and residual variants run on CUDA cores")
        layout = tensor_core_layout(cfg, proj, swiglu, warps_n, n_frags, m_frags, k_tiles, stages, dynamic_smem, gpu)
        if dynamic_smem is None:  # a default layout: dynamic where static shared memory would not hold it
            dynamic_smem = staged_bytes(cfg, swiglu, layout) > gpu.shared_memory_per_block
        return _cuda_tensor_cores(sch, swiglu, layout, scope="shared.dyn" if dynamic_smem else "shared")
    if dynamic_smem:
        raise ValueError("dynamic_smem: a knob of the tensor-core schedule, not of the CUDA-core one")
    vector = vector or per_load(cfg.weight_dtype)
    prologue = "norm" if norm else "rmsnorm" if rmsnorm else ""
    layout = cuda_layout(
        cfg, proj, rows, threads_per_row, vector, batch_tile, smem_bytes, rows_per_thread, prologue, gpu, swiglu
    )
    rows, threads_per_row, b_tile, k_chunk, per_thread = layout
    row_threads = rows // per_thread
    if norm and (rows == 1 or cfg.model.head_v_dim % threads_per_row):
        raise ValueError(f"norm prologue: {rows} rows a CTA, {threads_per_row} threads a row: needs > 1, dividing Dv")
    if rmsnorm and (rows == 1 or cfg.model.projections[proj][1] % (row_threads * threads_per_row)):
        raise ValueError(
            f"rmsnorm prologue: {rows} rows a CTA, {row_threads * threads_per_row} threads: needs > 1, dividing K"
        )
    b_tiles = math.ceil(cfg.batch / b_tile)

    blk = sch.get_sblock("gemv")
    b, n, *pair, k = sch.get_loops(blk)
    ko, kt, kv = sch.split(k, factors=[None, threads_per_row, vector])
    rf = sch.rfactor(kt, factor_axis=0)
    b, n, *pair, ko, kt, kv = sch.get_loops(rf)
    bo, bi = sch.split(b, factors=[b_tiles, b_tile])
    no, ny, nt = sch.split(n, factors=[None, row_threads, per_thread])
    kc, ki = sch.split(ko, factors=[None, k_chunk])
    # SwiGLU: the gate/up loop outside the lanes, so that each w load covers rows of one half of w
    sch.reorder(no, bo, ny, kt, kc, ki, *pair, bi, nt, kv)
    bx = sch.fuse(no, bo)
    sch.bind(bx, "blockIdx.x")  # B tiles of the same rows are neighbours: w reuse in L2
    sch.bind(ny, "threadIdx.y")
    sch.bind(kt, "threadIdx.x")

    sch.reverse_compute_at(blk, ny, preserve_unit_loops=True)
    kr, br, nr, *pr = sch.get_loops(blk)[2:]
    sch.reorder(br, nr, *pr, kr)
    sch.bind(kr, "threadIdx.x")  # cross-thread allreduce: warp shuffles (+ smem across warps)
    sch.set_scope(rf, 0, "local")

    w_loc = sch.cache_read(rf, 1, "local")
    sch.compute_at(w_loc, pair[0] if swiglu else ki)  # the thread's rows x one vector of K, before the lanes
    sch.vectorize(sch.get_loops(w_loc)[-1])
    if rows > 1:  # x is shared by the CTA's rows: stage the chunk once (with one row, each x is read once)
        x_sh = sch.get_sblock("normed") if prologue else sch.cache_read(rf, 0, "shared")
        sch.set_scope(x_sh, 0, "shared")
        sch.compute_at(x_sh, kc)
        fused = sch.fuse(*sch.get_loops(x_sh)[4:])
        _, ty, tx, v = sch.split(fused, factors=[None, row_threads, threads_per_row, vector])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        vectorize_floats(sch, v)
    if prologue:
        _prologue_sums(sch, bx, row_threads, threads_per_row, per_head=norm)
    x_loc = sch.cache_read(rf, 0, "local")
    sch.compute_at(x_loc, bi)
    vectorize_floats(sch, sch.get_loops(x_loc)[-1])

    sch.decompose_reduction(rf, kc)
    _, ku = sch.split(ki, factors=[None, _divisor_at_most(k_chunk, unroll)])
    sch.unroll(ku)
    if conv or swiglu or residual:
        sch.set_scope(blk, 0, "shared")
        for name in ("swiglu",) if swiglu else ("conv", "store") if conv else ("residual",):
            block = sch.get_sblock(name)
            sch.reverse_compute_at(block, ny, preserve_unit_loops=True)
            b, n, *_ = sch.get_loops(block)[2:]
            _, tx = sch.split(sch.fuse(b, n), factors=[None, threads_per_row])
            sch.bind(tx, "threadIdx.x")


def uses_tensor_cores(
    cfg: DecodeConfig,
    proj: str,
    conv: bool = False,
    norm: bool = False,
    swiglu: bool = False,
    rmsnorm: bool = False,
    residual: bool = False,
) -> bool:
    """The default: tensor cores for bf16 weights, whole 16-lane tiles from `TENSOR_CORE_LANES` lanes (from 16 at
    `TENSOR_CORE_ROWS` rows) and whole 16 x 16 tiles of w, no prologue or conv/residual epilogue (those variants run
    at B = 1)."""
    n_rows, n_cols = cfg.model.projections[proj]
    return (
        cfg.weight_dtype == "bfloat16"
        and cfg.batch >= (mma.TILE if n_rows >= TENSOR_CORE_ROWS else TENSOR_CORE_LANES)
        and cfg.batch % mma.TILE == 0
        and n_rows // (2 if swiglu else 1) % mma.TILE == 0
        and n_cols % mma.TILE == 0
        and not (conv or norm or rmsnorm or residual)
    )


def tensor_core_layout(
    cfg: DecodeConfig,
    proj: str,
    swiglu: bool = False,
    warps_n: int | None = None,
    n_frags: int | None = None,
    m_frags: int | None = None,
    k_tiles: int | None = None,
    stages: int | None = None,
    dynamic_smem: bool | None = None,
    gpu: GpuSpec = DEFAULT_GPU,
) -> TensorCoreLayout:
    """The `TensorCoreLayout` of the tensor-core schedule.

    A CTA covers `B / b_tiles` lanes (`warps_m * m_frags` 16-lane tiles) and `warps_n * n_frags` 16-row tiles of w
    (SwiGLU: output rows, each a gate and an up row), staging `k_tiles * 16` columns of x and w a step in shared
    memory, `stages` steps in flight. Defaults: 1 m tile a warp and `STAGES` stages (4 and 1 from `MANY_ROW_TILES`
    row tiles), 4 k tiles a step; the most rows a CTA (up to 4 warps of 2 tiles) that still give every SM a CTA; the
    fewest B tiles whose chunks fit the shared memory a CTA may take (every lane in one CTA where they do, so each
    weight byte is read once): statically, or with `dynamic_smem` what the GPU allows a kernel that opts in (refused
    where the layout fits statically: the static kernel is the same design). Where `warps_n`, `n_frags`, `m_frags`
    and `dynamic_smem` are all left to the default, the wide CTAs of `_wide` where those apply, in what a kernel
    that opts in may take (`cuda` stages a layout in dynamic shared memory where static would not hold it).
    """
    if cfg.weight_dtype != "bfloat16" or cfg.batch % mma.TILE:
        raise ValueError(f"tensor cores: bf16 weights and lanes in 16s, not {cfg.weight_dtype} x {cfg.batch}")
    n_rows, n_cols = cfg.model.projections[proj]
    n_rows //= 2 if swiglu else 1
    if n_rows % mma.TILE or n_cols % mma.TILE:
        raise ValueError(f"{proj}: {n_rows} x {n_cols} is not whole 16 x 16 tiles")
    m_tiles, n_tiles, k_all = cfg.batch // mma.TILE, n_rows // mma.TILE, n_cols // mma.TILE
    many_rows = n_tiles >= MANY_ROW_TILES
    wide = _wide(m_tiles, n_tiles, many_rows, gpu)
    wide = wide if warps_n is None and n_frags is None and m_frags is None and dynamic_smem is None else None
    if wide:
        warps_n, n_frags, m_frags = wide["warps_n"], wide["n_frags"], wide["m_frags"]
    smem = gpu.shared_memory_optin if dynamic_smem or wide else gpu.shared_memory_per_block
    k_tiles = k_tiles or _divisor_at_most(k_all, 4)
    stages = stages or (1 if many_rows else STAGES)
    m_frags = m_frags or (min(4, m_tiles) if many_rows else 1)
    if m_tiles % m_frags or k_all % k_tiles:
        raise ValueError(f"{proj}: {m_frags} m tiles a warp, {k_tiles} k tiles a step do not divide the shape")
    shapes = [(w, f) for w in (4, 2, 1) for f in (2, 1) if n_tiles % (w * f) == 0]
    if warps_n is not None and n_frags is not None:
        shapes = [(warps_n, n_frags)]
    elif warps_n is not None or n_frags is not None:
        shapes = [(w, f) for w, f in shapes if warps_n in (None, w) and n_frags in (None, f)]
    if not shapes or n_tiles % (shapes[0][0] * shapes[0][1]):
        raise ValueError(f"{proj}: {warps_n} x {n_frags} tiles a CTA do not divide {n_tiles}")

    # the most rows a CTA that still give every SM a CTA, then the fewest; for each, the fewest B tiles that fit
    def fewer_ctas(shape: tuple[int, int]) -> tuple[bool, int]:
        fill = n_tiles // (shape[0] * shape[1]) >= gpu.sms
        return not fill, -shape[0] * shape[1] if fill else shape[0] * shape[1]

    shapes.sort(key=fewer_ctas)
    per_warp = m_tiles // m_frags
    for w_n, f_n in shapes:
        for b_tiles in (d for d in range(1, per_warp + 1) if per_warp % d == 0):
            layout = TensorCoreLayout(b_tiles, per_warp // b_tiles, m_frags, w_n, f_n, k_tiles, stages)
            need = staged_bytes(cfg, swiglu, layout)
            if layout.warps_m * w_n <= 8 and need <= smem:
                if dynamic_smem and need <= gpu.shared_memory_per_block:  # the static layout: nothing to time twice
                    raise ValueError(f"{proj}: {need} bytes fit static shared memory: dynamic_smem adds nothing")
                return layout
    raise ValueError(
        f"{proj}: no B tiling of {m_frags} m tiles a warp, {stages} stages fits {smem} bytes of shared memory"
    )


def _wide(m_tiles: int, n_tiles: int, many_rows: bool, gpu: GpuSpec) -> dict[str, int] | None:
    """The wide-CTA knobs a default tensor-core layout takes at this shape (see `WIDE_LM_HEAD`), or None."""
    if m_tiles * mma.TILE < TENSOR_CORE_LANES:
        return None
    if many_rows:
        return WIDE_LM_HEAD
    b_tiles = max(1, m_tiles // 8)  # 8 warps of one lane tile a CTA
    for n_frags in (4, 2):
        if n_tiles % n_frags == 0 and (n_frags == 2 or n_tiles // n_frags * b_tiles >= gpu.sms // 2):
            return {"m_frags": 1, "warps_n": 1, "n_frags": n_frags}
    return None


def staged_bytes(cfg: DecodeConfig, swiglu: bool, layout: TensorCoreLayout) -> int:
    """Shared memory a CTA of `layout` takes: `stages` padded chunks of x (float32) and w (bf16), and SwiGLU's gate
    and up sums."""
    lanes, rows = cfg.batch // layout.b_tiles, layout.warps_n * layout.n_frags * mma.TILE
    chunk = mma.TILE * layout.k_tiles
    return layout.stages * (lanes * (chunk + 4) * 4 + rows * (chunk + 8) * 2) + (2 * lanes * rows * 4 if swiglu else 0)


def _cuda_tensor_cores(sch: s_tir.Schedule, swiglu: bool, layout: TensorCoreLayout, scope: str) -> None:
    """`mma.sync` on 16 x 16 x 16 tiles (`schedules/mma.py`: x split into bf16 hi + lo, float32 accumulate).

    CTAs over (row tiles, B tiles), B tiles of the same rows neighbours; warps over (B, rows). Each k step the CTA
    stages its lanes' x chunk (float32) and its rows' w chunk (bf16) in padded shared memory with 16-byte loads,
    then each warp loads its x fragments (splitting them), its w fragments (ldmatrix) and issues the mma's. With
    `stages` > 1 the k steps are a software pipeline: the chunks of the next `stages - 1` steps are in flight
    (`cp.async`, one buffer a stage) while the warps multiply this one.
    Accumulators stay in registers: y is stored from them; SwiGLU's gate and up sums (the gate/up loop outside the
    k steps) go to shared memory, then the CTA's threads write `silu(gate) * up`. Shared memory is of `scope`:
    "shared" (static) or "shared.dyn" (one dynamic allocation, which TVM's CUDA runtime opts in for above 48 KB).
    """
    b_tiles, warps_m, m_frags, warps_n, n_frags, k_tiles, stages = layout
    blk = sch.get_sblock("gemv")
    b, n, *pair, k = sch.get_loops(blk)
    b0, b1, b2, bi = sch.split(b, factors=[b_tiles, warps_m, m_frags, mma.TILE])
    n0, n1, n2, ni = sch.split(n, factors=[None, warps_n, n_frags, mma.TILE])
    k0, k1, ki = sch.split(k, factors=[None, k_tiles, mma.TILE])
    sch.reorder(n0, b0, b1, n1, *pair, k0, k1, b2, n2, bi, ni, ki)
    cta = sch.fuse(n0, b0)
    sch.bind(cta, "blockIdx.x")
    warp = sch.fuse(b1, n1)
    sch.bind(warp, "threadIdx.y")
    if swiglu:  # after the CTA's sums: each thread writes some (lane, row)s
        out = sch.get_sblock("swiglu")
        sch.reverse_compute_at(out, cta, preserve_unit_loops=True)
        b, n, _ = sch.get_loops(out)[-3:]
        _, ty, tx = sch.split(sch.fuse(b, n), factors=[None, warps_m * warps_n, mma.WARP])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
    tile = sch.blockize(bi)
    for index, vector in ((0, mma.TILE // 4), (1, mma.TILE // 2)):  # x: float4s, w: 8 bf16 a load
        staged = sch.cache_read(tile, index, scope)
        sch.compute_at(staged, k0)
        fused = sch.fuse(*sch.get_loops(staged)[-2:])
        _, ty, tx, v = sch.split(fused, factors=[None, warps_m * warps_n, mma.WARP, vector])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.vectorize(v)
        sch.storage_align(staged, 0, axis=-2, factor=32, offset=vector)  # rows padded: no bank conflicts
    fragments = [sch.cache_read(tile, index, "warp") for index in (0, 1)]
    for fragment in fragments:
        sch.compute_at(fragment, k1)
    acc = sch.cache_write(tile, 0, "warp")
    sch.reverse_compute_at(acc, pair[0] if swiglu else warp)
    if swiglu:  # gate_up in shared memory, read back by the warp that wrote it
        sch.set_scope(acc, 0, scope)
    *_, i, j = sch.get_loops(acc)
    io, ii = sch.split(i, factors=[None, mma.TILE])
    jo, ji = sch.split(j, factors=[None, mma.TILE])
    sch.reorder(io, jo, ii, ji)
    sch.decompose_reduction(tile, k0)
    if stages > 1:  # k0's body: the x copy, the w copy, the k1 loop of fragment loads and mma's
        sch.annotate(k0, "software_pipeline_stage", [0, 0, stages - 1])
        sch.annotate(k0, "software_pipeline_order", [0, 1, 2])
        sch.annotate(k0, "software_pipeline_async_stages", [0])
    loads = [_tile_loop(sch, fragment) for fragment in fragments]
    for fragment in (*fragments, acc):
        sch.transform_layout(fragment, ("read", 0) if fragment == acc else ("write", 0), mma.index_map)
    sch.tensorize(loads[0], mma.LOAD_X[scope])
    sch.tensorize(loads[1], mma.LOAD_W[scope])
    sch.tensorize(sch.get_loops(blk)[-3], mma.MMA)
    sch.tensorize(sch.get_loops(sch.get_sblock("gemv_init"))[-2], mma.FILL)
    sch.tensorize(sch.get_loops(acc)[-2], mma.STORE[scope if swiglu else "global"])


def _tile_loop(sch: s_tir.Schedule, block) -> s_tir.schedule.LoopRV:
    """The copy `block`'s last two loops tiled by 16: the loop that a fragment load tensorizes."""
    i, j = sch.get_loops(block)[-2:]
    io, ii = sch.split(i, factors=[None, mma.TILE])
    jo, ji = sch.split(j, factors=[None, mma.TILE])
    sch.reorder(io, jo, ii, ji)
    return ii


def _prologue_sums(sch: s_tir.Schedule, bx, row_threads: int, threads_per_row: int, per_head: bool) -> None:
    """Block "sumsq" at the start of each CTA, into shared memory. `per_head` (the gated norm): (lane, head) pairs
    over threadIdx.y, each head reduced by the threadIdx.x threads of a row (a warp-shuffle allreduce); else (the
    rmsnorm) lane by lane, each lane's row reduced by all of the CTA's threads (over threadIdx.y and threadIdx.x)."""
    sumsq = sch.get_sblock("sumsq")
    sch.compute_at(sumsq, bx, preserve_unit_loops=True)
    sch.set_scope(sumsq, 0, "shared")
    if per_head:
        b, h, d = sch.get_loops(sumsq)[-3:]
        sch.bind(sch.split(sch.fuse(b, h), factors=[None, row_threads])[1], "threadIdx.y")
        sch.bind(sch.split(d, factors=[None, threads_per_row])[1], "threadIdx.x")
        return
    _, ty, tx = sch.split(sch.get_loops(sumsq)[-1], factors=[None, row_threads, threads_per_row])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")


def cuda_layout(
    cfg: DecodeConfig,
    proj: str,
    rows: int | None = None,
    threads_per_row: int | None = None,
    vector: int | None = None,
    batch_tile: int = 16,
    smem_bytes: int = 24576,
    rows_per_thread: int | None = None,
    prologue: str = "",
    gpu: GpuSpec = DEFAULT_GPU,
    swiglu: bool = False,
) -> tuple[int, int, int, int, int]:
    """`(rows, threads_per_row, lanes per B tile, K steps per smem chunk, rows per thread)` of the CUDA schedule
    (`prologue` "norm" or "rmsnorm": see `PROLOGUE_ROWS`; `swiglu`: rows are output rows, N/2 of them, each two rows
    of w, and 2 a thread by default from 8 lanes on: the 4 rows of w of the plain default).

    The grid is `N / rows * ceil(B / lanes)` CTAs of `rows / rows_per_thread * threads_per_row` threads; one K
    step is `threads_per_row * vector` columns (default `vector`: a 16-byte load of the weight dtype).
    """
    vector = vector or per_load(cfg.weight_dtype)
    n_rows, n_cols = cfg.model.projections[proj]
    if not (prologue or swiglu) and SMALL_LANES[0] <= cfg.batch < SMALL_LANES[1] and n_rows * n_cols < SMALL_WEIGHTS:
        rows, threads_per_row = rows or 1, threads_per_row or 32
        rows_per_thread = rows_per_thread or 1
    n_rows //= 2 if swiglu else 1
    b_tiles = math.ceil(cfg.batch / batch_tile)
    flop_bound = cfg.batch >= MANY_LANES and n_rows >= 1024 and n_rows % WIDE_ROWS == 0
    wide = (  # the prologue's layout where it applies (else the plain one, at least 2 rows a CTA: a stage for x)
        not flop_bound
        and prologue in PROLOGUE_ROWS
        and n_rows % PROLOGUE_ROWS[prologue][0] == 0
        and (
            prologue == "norm"
            or n_rows // PROLOGUE_ROWS[prologue][0] * b_tiles >= 2 * gpu.sms
            and n_cols <= PROLOGUE_COLS
        )
    )
    if rows_per_thread is None:
        rows_per_thread = (
            math.gcd(n_rows, 2 if swiglu else 4)  # as many as divide the rows (a vocabulary of odd size: 1)
            if cfg.batch >= MANY_LANES
            else PROLOGUE_ROWS[prologue][1]
            if wide
            else 1
        )
    if rows is None and wide:
        rows = PROLOGUE_ROWS[prologue][0]
    elif rows is None:
        rows = WIDE_ROWS if flop_bound else max(rows_per_thread, 2 if prologue and n_rows % 2 == 0 else 1)
        while rows < 8 * rows_per_thread and n_rows % (2 * rows) == 0 and n_rows // (2 * rows) * b_tiles >= 2 * gpu.sms:
            rows *= 2
    if rows % rows_per_thread or n_rows % rows:
        raise ValueError(f"{proj}: {rows} rows a CTA do not split into {rows_per_thread} a thread or divide {n_rows}")
    if threads_per_row is None and (flop_bound or wide):
        threads_per_row = 32
    elif threads_per_row is None:  # a power of two dividing K / vector; up to 1024 when there are too few CTAs
        threads_per_row = (
            (gpu.max_threads_per_block if n_rows // rows * b_tiles < gpu.sms else 256) * rows_per_thread // rows
        )
        while threads_per_row > 32 and (n_cols // vector) % threads_per_row:
            threads_per_row //= 2
    threads = rows // rows_per_thread * threads_per_row
    if threads > gpu.max_threads_per_block:  # such a CTA does not launch (and writes nothing)
        raise ValueError(f"{proj}: {threads} threads exceed a CTA's {gpu.max_threads_per_block}")
    k_steps = math.ceil(n_cols / (threads_per_row * vector))
    if rows == 1:  # x goes straight to registers: no smem chunk
        return rows, threads_per_row, _lane_tile(cfg.batch, batch_tile), k_steps, rows_per_thread
    step_bytes = threads_per_row * vector * 4  # x bytes one lane consumes per K step
    b_tile = _lane_tile(cfg.batch, max(1, min(batch_tile, smem_bytes // step_bytes)))
    k_chunk = _divisor_at_most(k_steps, smem_bytes // (b_tile * step_bytes))
    return rows, threads_per_row, b_tile, k_chunk, rows_per_thread


def _divisor_at_most(n: int, cap: int) -> int:
    """The largest divisor of `n` that is <= `cap` (at least 1)."""
    return max(d for d in range(1, max(1, min(cap, n)) + 1) if n % d == 0)


def _lane_tile(batch: int, cap: int) -> int:
    """Lanes per B tile, <= `cap`: a divisor of `batch` if one is > cap/2, else the balanced split (predicated)."""
    d = _divisor_at_most(batch, cap)
    return d if 2 * d > cap else math.ceil(batch / math.ceil(batch / cap))
