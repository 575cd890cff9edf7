"""bf16 tensor-core intrinsics (`mma.sync.m16n8k16`, float32 accumulate) for the batched GEMVs.

TVM 0.27 registers MMA intrinsics for f16, int8 and fp8 only. These tensorize a 16 x 16 x 16 tile of
`y[b, n] += x[b, k] * float32(w[n, k])` with x float32 and w bf16 as stored: the float32 activations are split
on their way into registers into `hi = bf16(x)` and `lo = bf16(x - hi)`, and each tile issues `hi . w + lo . w`
(four `mma.sync` per 16 x 16 x 16: two n halves, two parts). `hi + lo` carries 16 of x's 24 significand bits
(a relative error <= 2^-17 on each product, ~1e-5 on a sum), so the projection keeps float32 activations
and matches the same float64 reference as the CUDA-core schedules; x is never rounded to bf16 alone.

The fill and store intrinsics are the project's too: TVM's `tvm.s_tir.tensor_intrin` package parses hundreds of
intrinsics on import (about a minute here), which every process importing the registry would pay.

A warp holds a 16 x 16 tile as `[32 threads, 8]` in the register layout of `mma.sync` (the PTX ISA's fragment
figures for m16n8k16): the descriptions below use TVM's logical index map for tensorize matching, the
implementations write and read the physical layout.
  A (x, float32 buffer): slots 0-3 hold the bf16 pairs of `hi` (registers a0..a3), slots 4-7 those of `lo`.
  B (w, bf16, an `[n, k]` tile): element e of thread t is `(n, k) = (t/4 + 8(e/4), 2(t%4) + e%2 + 8((e/2)%2))`.
  C (y, float32): element e of thread t is `(row, col) = (t/4 + 8((e/2)%2), 2(t%4) + e%2 + 8(e/4))`, TVM's own
  layout (its fill and store intrinsics serve it unchanged).
"""

from __future__ import annotations

import threading

from tvm.s_tir import TensorIntrin
from tvm.script import tirx as T

TILE = 16  # m = n = k of one tensorized tile
WARP = 32
PER_THREAD = 8  # a 16 x 16 tile's elements per thread

# Shared memory a CTA declares statically ("shared", up to 48 KB) or as one dynamic allocation ("shared.dyn", up to
# the GPU's opt-in limit): a tensorize intrinsic matches buffers of its own scope only, so the intrinsics that read
# or write shared memory come in both.
SHARED_SCOPES = ("shared", "shared.dyn")
LOAD_X = {scope: f"gdn_tvm_mma_load_x_split_{scope}" for scope in SHARED_SCOPES}  # float32 x tile -> hi/lo (warp)
LOAD_W = {scope: f"gdn_tvm_mma_load_w_bf16_{scope}" for scope in SHARED_SCOPES}  # bf16 [n, k] w tile -> warp
MMA = "gdn_tvm_mma_f32split_bf16"  # C += A(hi + lo) . B^T
FILL = "gdn_tvm_mma_fill_f32"  # C = 0
STORE = {scope: f"gdn_tvm_mma_store_f32_{scope}" for scope in ("global", *SHARED_SCOPES)}  # a C fragment -> a tile


def fragment(i, j):
    """A 16 x 16 tile's element (row i, column j) -> (thread, slot) of its warp fragment: the C layout above (and,
    for tensorize matching, the logical layout of the A and B fragments)."""
    return 4 * (i % 8) + j % 8 // 2, 4 * (j // 8) + 2 * (i // 8) + j % 2


def _element(t, s):
    """The inverse of `fragment`: slot `s` of thread `t` -> (row, column)."""
    return t // 4 + 8 * (s // 2 % 2), 2 * (t % 4) + s % 2 + 8 * (s // 4)


def index_map(*axes):
    """`transform_layout` of a warp buffer whose last two axes are tiled by 16: (..., i, j) -> (..., i/16, j/16,
    thread, slot)."""
    *lead, i, j = axes
    return (*lead, i // TILE, j // TILE, *fragment(i % TILE, j % TILE))


def _bf16_bits(x):
    """float32 -> bf16 rounded to nearest even, as the low 16 bits of a uint32 (integer ops only)."""
    u = T.reinterpret("uint32", x)
    return (u + T.uint32(0x7FFF) + ((u >> T.uint32(16)) & T.uint32(1))) >> T.uint32(16)


def _hi_lo(x):
    """The bf16 bits of `hi = bf16(x)` and `lo = bf16(x - hi)`."""
    hi = _bf16_bits(x)
    return hi, _bf16_bits(x - T.reinterpret("float32", hi << T.uint32(16)))


def _pair(low, high):
    """Two bf16 bit patterns as one 32-bit register (the first element in the low half), typed float32."""
    return T.reinterpret("float32", (high << T.uint32(16)) | low)


def _x_slot(shared, t, s):
    """Slot `s` of thread `t`'s x fragment: the bf16 pair of register `s % 4` of `hi` (s < 4) or `lo`; register r
    holds rows t/4 (+8 for odd r), columns 2(t%4), 2(t%4)+1 (+8 from r = 2)."""
    r = s % 4
    row, col = t // 4 + 8 * (r % 2), 2 * (t % 4) + 8 * (r // 2)
    hi0, lo0 = _hi_lo(shared[row, col])
    hi1, lo1 = _hi_lo(shared[row, col + 1])
    return T.if_then_else(s < 4, _pair(hi0, hi1), _pair(lo0, lo1))


def _load_desc(dtype: str, scope: str):
    """What a fragment load does: a 16 x 16 `dtype` tile of `scope` memory into a warp's fragment."""

    @T.prim_func(s_tir=True)
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (TILE, TILE), dtype, offset_factor=1, scope=scope)
        warp = T.match_buffer(warp_handle, (WARP, PER_THREAD), dtype, offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:PER_THREAD])
            for i, j in T.grid(TILE, TILE):
                with T.sblock("load"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    t, s = T.meta_var(fragment(vi, vj))
                    warp[t, s] = shared[vi, vj]

    return desc


def _load_x(scope: str):
    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0, s1 = T.int32(), T.int32()
        shared = T.match_buffer(shared_handle, (TILE, TILE), "float32", offset_factor=1, scope=scope, strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:PER_THREAD])
            for t in T.thread_binding(0, WARP, "threadIdx.x"):
                for s in T.serial(PER_THREAD):  # one store per slot: LowerWarpMemory reads `t * 8 + s`
                    warp[t, s] = _x_slot(shared, t, s)

    return _load_desc("float32", scope), impl


def _load_w(scope: str):
    @T.prim_func(s_tir=True)
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        s0, s1 = T.int32(), T.int32()
        shared = T.match_buffer(shared_handle, (TILE, TILE), "bfloat16", offset_factor=1, scope=scope, strides=[s0, s1])
        warp = T.match_buffer(warp_handle, (WARP, PER_THREAD), "bfloat16", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(shared[0:TILE, 0:TILE])
            T.writes(warp[0:WARP, 0:PER_THREAD])
            for t in T.thread_binding(0, WARP, "threadIdx.x"):
                # ldmatrix.x4: threads 0-7 give the rows of (n 0-7, k 0-7), 8-15 (n 0-7, k 8-15), 16-23 (n 8-15,
                # k 0-7), 24-31 (n 8-15, k 8-15); register r of thread t gets matrix r's row t/4, columns 2(t%4) +0/1
                T.evaluate(
                    T.ptx_legacy.ldmatrix(
                        False,
                        4,
                        ".b16",
                        warp.data,
                        warp.elem_offset + PER_THREAD * t,
                        shared.access_ptr("r"),
                        s0 * (t % 8 + 8 * (t // 16)) + 8 * (t % 16 // 8),
                        dtype="bfloat16",
                    )
                )

    return _load_desc("bfloat16", scope), impl


def _mma_sync(A, B, C, t, half: int, part: int):
    """One `mma.sync.m16n8k16` of thread `t`: C's n `half` (8 columns) += A's `part` (0: hi, 1: lo) . B's half."""
    return T.ptx_legacy.mma(
        "m16n8k16",
        "row",
        "col",
        "bf16",
        "bf16",
        "fp32",
        A.data,
        A.elem_offset + t * PER_THREAD + 4 * part,
        B.data,
        B.elem_offset + t * PER_THREAD + 4 * half,
        C.data,
        C.elem_offset + t * PER_THREAD + 4 * half,
        False,
        dtype="float32",
    )


def _mma():
    @T.prim_func(s_tir=True)
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        B = T.match_buffer(b, (WARP, PER_THREAD), "bfloat16", offset_factor=1, scope="warp")
        C = T.match_buffer(c, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:PER_THREAD], A[0:WARP, 0:PER_THREAD], B[0:WARP, 0:PER_THREAD])
            T.writes(C[0:WARP, 0:PER_THREAD])
            for i, j, k in T.grid(TILE, TILE, TILE):
                with T.sblock("mma"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    tc, sc = T.meta_var(fragment(vi, vj))
                    ta, sa = T.meta_var(fragment(vi, vk))
                    tb, sb = T.meta_var(fragment(vj, vk))
                    T.reads(C[tc, sc], A[ta, sa], B[tb, sb])
                    T.writes(C[tc, sc])
                    C[tc, sc] = C[tc, sc] + A[ta, sa] * T.Cast("float32", B[tb, sb])

    @T.prim_func(s_tir=True)
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        B = T.match_buffer(b, (WARP, PER_THREAD), "bfloat16", offset_factor=1, scope="warp")
        C = T.match_buffer(c, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads(C[0:WARP, 0:PER_THREAD], A[0:WARP, 0:PER_THREAD], B[0:WARP, 0:PER_THREAD])
            T.writes(C[0:WARP, 0:PER_THREAD])
            for t in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(_mma_sync(A, B, C, t, 0, 0))  # n half 0, hi
                T.evaluate(_mma_sync(A, B, C, t, 0, 1))  # n half 0, lo
                T.evaluate(_mma_sync(A, B, C, t, 1, 0))
                T.evaluate(_mma_sync(A, B, C, t, 1, 1))

    return desc, impl


def _fill():
    @T.prim_func(s_tir=True)
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:PER_THREAD])
            for i, j in T.grid(TILE, TILE):
                with T.sblock("fill"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    t, s = T.meta_var(fragment(vi, vj))
                    C[t, s] = T.float32(0)

    @T.prim_func(s_tir=True)
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        with T.sblock("root"):
            T.reads()
            T.writes(C[0:WARP, 0:PER_THREAD])
            for _t in T.thread_binding(0, WARP, "threadIdx.x"):
                T.evaluate(T.cuda.mma_fill_legacy(PER_THREAD, C.data, C.elem_offset, dtype="float32"))

    return desc, impl


def _store(scope: str):
    """A C fragment into a 16 x 16 tile of `scope` memory, slot by slot (once a CTA: TVM's `mma_store` would
    need its `tensor_intrin` package registered, a minute of parsing in every process)."""

    @T.prim_func(s_tir=True)
    def desc(c_warp: T.handle, c: T.handle) -> None:
        C_warp = T.match_buffer(c_warp, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        C = T.match_buffer(c, (TILE, TILE), "float32", offset_factor=1, scope=scope)
        with T.sblock("root"):
            T.reads(C_warp[0:WARP, 0:PER_THREAD])
            T.writes(C[0:TILE, 0:TILE])
            for i, j in T.grid(TILE, TILE):
                with T.sblock("store"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    t, s = T.meta_var(fragment(vi, vj))
                    C[vi, vj] = C_warp[t, s]

    @T.prim_func(s_tir=True)
    def impl(c_warp: T.handle, c: T.handle) -> None:
        s0, s1 = T.int32(), T.int32()
        C_warp = T.match_buffer(c_warp, (WARP, PER_THREAD), "float32", offset_factor=1, scope="warp")
        C = T.match_buffer(c, (TILE, TILE), "float32", offset_factor=1, scope=scope, strides=[s0, s1])
        with T.sblock("root"):
            T.reads(C_warp[0:WARP, 0:PER_THREAD])
            T.writes(C[0:TILE, 0:TILE])
            for t in T.thread_binding(0, WARP, "threadIdx.x"):
                for s in T.serial(PER_THREAD):
                    row, col = T.meta_var(_element(t, s))
                    C[row, col] = C_warp[t, s]

    return desc, impl


def _register() -> None:
    intrinsics = [(MMA, _mma()), (FILL, _fill())]
    intrinsics += [(LOAD_X[scope], _load_x(scope)) for scope in SHARED_SCOPES]
    intrinsics += [(LOAD_W[scope], _load_w(scope)) for scope in SHARED_SCOPES]
    intrinsics += [(name, _store(scope)) for scope, name in STORE.items()]
    for name, (desc, impl) in intrinsics:
        TensorIntrin.register(name, desc, impl, override=True)


# Parsed on a thread of their own: each `T.prim_func` walks its caller's stack (`inspect.stack`), and inside an
# import that stack is ~40 frames of importlib that inspect maps to no module, scanning `sys.modules` for each
# (~0.4 s a parse, 10 s for these); a fresh thread's stack is a few frames.
_parsing = threading.Thread(target=_register, name="gdn_tvm.mma")
_parsing.start()
_parsing.join()
