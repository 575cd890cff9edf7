"""TIR pieces that several ops share (not an op itself: the registry never imports it).

Each helper here is called in a `prim_func` body and expands a fresh `T.macro` there: TVM suffixes the block names
of a macro object's later expansions (`sumsq_1`), and block names are the schedules' interface.
"""

from __future__ import annotations

import tvm
from tvm.backend.cuda.op import cuda_func_call
from tvm.ir import _ffi_api  # RegisterOp: the Python API registers attributes of existing ops only
from tvm.script import tirx as T
from tvm.tirx.op import register_intrin_lowering

# TIR ops of the project's own, registered on import (every process that compiles imports this module through the
# registry: builds, tuner workers, the stub-driver export), each lowered on CUDA to a helper function every thread of
# a CTA calls.
#
# `arrive`: a CTA's ticket among those that share a counter, the CTA drawing the last one doing the work that needs all
# of theirs (CUDA's threadFenceReduction pattern): a barrier, then the first thread makes the CTA's writes visible to
# the device (`__threadfence`, cumulative over what the barrier ordered) and draws the ticket with `atomicAdd`; every
# thread then reads it and fences again, so that the CTA drawing the last ticket sees the others' writes.
# `grid_sync` and `grid_exit` (codegen.persistent): a grid barrier (arrive, then the first thread spins until the
# count reaches its target, backing off with `__nanosleep`) and the exit count whose last CTA zeroes both counters.
# `prefetch_l2` (codegen.persistent): CTA `blockIdx.x` of `ctas` asks L2 for its share of a tensor's bytes
# (`prefetch.global.L2`, 128-byte lines strided over the CTA's threads, nothing waited for): what a persistent
# kernel's CTAs do with the time a barrier leaves them idle.
ARRIVE, GRID_SYNC, GRID_EXIT = "gdn_tvm.arrive", "gdn_tvm.grid_sync", "gdn_tvm.grid_exit"
PREFETCH_L2 = "gdn_tvm.prefetch_l2"
_CUDA = {  # name -> (the helper's source, how many of the call's arguments it takes)
    ARRIVE: (
        """
__forceinline__ __device__ int gdn_tvm_arrive(int* counter) {
  __shared__ int ticket;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence();
    ticket = atomicAdd(counter, 1);
  }
  __syncthreads();
  int drawn = ticket;
  __threadfence();
  __syncthreads();
  return drawn;
}
""",
        1,
    ),
    GRID_SYNC: (
        """
__forceinline__ __device__ int gdn_tvm_grid_sync(int* sync, int target) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    __threadfence();
    atomicAdd(sync, 1);
    while (*(volatile int*)sync < target) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  return 0;
}
""",
        2,
    ),
    GRID_EXIT: (
        """
__forceinline__ __device__ int gdn_tvm_grid_exit(int* sync, int ctas) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && atomicAdd(sync + 1, 1) == ctas - 1) {
    sync[0] = 0;
    sync[1] = 0;
  }
  return 0;
}
""",
        2,
    ),
    PREFETCH_L2: (
        """
__forceinline__ __device__ int gdn_tvm_prefetch_l2(const void* data, long long bytes, int ctas) {
  long long slice = ((bytes + ctas - 1) / ctas + 127) / 128 * 128;
  long long end = (blockIdx.x + 1LL) * slice < bytes ? (blockIdx.x + 1LL) * slice : bytes;
  int threads = blockDim.x * blockDim.y * blockDim.z;
  int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  for (long long at = blockIdx.x * slice + 128LL * t; at < end; at += 128LL * threads)
    asm volatile("prefetch.global.L2 [%0];" : : "l"((const char*)data + at));
  return 0;
}
""",
        3,
    ),
}
_OPAQUE = 3  # CallEffectKind::kOpaque: never hoisted, merged or dropped

for _name, (_source, _args) in _CUDA.items():
    if _name in tvm.ir.Op.list_op_names():  # once a process
        continue
    _helper = _name.replace(".", "_")
    _ffi_api.RegisterOp(_name, f"{_helper} (gdn_tvm.ops.common)")
    tvm.ir.register_op_attr(_name, "TCallEffectKind", _OPAQUE)
    tvm.ir.register_op_attr(_name, "TScriptPrinterName", _name)
    register_intrin_lowering(
        _name,
        "cuda",
        f=lambda call, h=_helper, src=_source, n=_args: cuda_func_call(
            h, *call.args[:n], source_code=src, return_type="int32"
        ),
    )
# A CPU build runs the arriving CTAs one after another in index order (their loop serial), so the ticket a CTA draws
# is its index: no counter is touched. Grid barriers and prefetches have no CPU lowering: persistent kernels are CUDA's.
register_intrin_lowering(ARRIVE, "llvm", f=lambda call: call.args[1])


def arrive(counter, serial):
    """The ticket (int32) the calling CTA draws at `counter` (an int32 element, zero before the first CTA arrives):
    0 for the first to arrive, n - 1 for the last of n. On CUDA an atomic increment; on the CPU `serial`, the CTA's
    index in a serial loop of the arriving CTAs (the CPU schedule must keep that loop serial). The CTA drawing the
    last ticket must set the counter back to zero for the next launch: a TIR expression."""
    return T.call_intrin("int32", ARRIVE, T.address_of(counter), serial)


def widened(value):
    """A load of a stored tensor as float32: itself where stored in float32 (the PrimFunc unchanged), else converted
    exactly (bf16 storage, float32 math): a TIR expression."""
    dtype = value.dtype if hasattr(value, "dtype") else value.ty  # a load made by a helper, outside the parser: `ty`
    return value if str(dtype) == "float32" else T.Cast("float32", value)


def one_plus(w):
    """`1 + w` of a zero-centred RMSNorm weight `w` (Qwen3.5 stores `w_eff - 1`), the 1 added in float32 to the
    widened stored value, as Hugging Face's `1.0 + weight.float()` does: a TIR expression."""
    return T.float32(1) + widened(w)


def rms_normalized(x, sumsq, n: int, eps: float, scale):
    """`x * rsqrt(sumsq / n + eps) * scale`, sumsq over x's n elements and scale a zero-centred weight's `one_plus`:
    the RMSNorm of every op that has one (the decoder layer's, the q/k heads'), a TIR expression."""
    return x * T.rsqrt(sumsq / T.float32(n) + T.float32(eps)) * scale


def narrowed(value, dtype: str):
    """A float32 `value` as stored in `dtype`: itself, or rounded to the nearest even bf16: a TIR expression."""
    return value if dtype == "float32" else T.Cast(dtype, value)


def sum_of_squares(name: str, extents: tuple[int, ...], x, out) -> None:
    """Block `name` over `extents`, the last reduced: `out[i...] = sum_k x(i..., k)^2`, with `x` an element
    accessor (e.g. `lambda b, h, d: qkv[b, h * D + d]`) and `out` of shape `extents[:-1]`."""
    kinds = "S" * (len(extents) - 1) + "R"

    @T.macro
    def block():
        for i in T.grid(*extents):
            with T.sblock(name):
                *vi, vk = T.axis.remap(kinds, i)
                with T.init():
                    out[vi] = T.float32(0)
                out[vi] = out[vi] + x(*vi, vk) * x(*vi, vk)

    block()
