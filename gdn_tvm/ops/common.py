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

# `arrive`: a CTA's ticket among those that share a counter, the CTA drawing the last one doing the work that needs all
# of theirs (CUDA's threadFenceReduction pattern). Every thread of the CTA calls it: a barrier, then the first thread
# makes the CTA's writes visible to the device (`__threadfence`, cumulative over what the barrier ordered) and draws
# the ticket with `atomicAdd`; every thread then reads it and fences again, so that the CTA drawing the last ticket
# sees the others' writes.
ARRIVE = "gdn_tvm.arrive"
_ARRIVE_CUDA = """
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
"""
_OPAQUE = 3  # CallEffectKind::kOpaque: never hoisted, merged or dropped

if ARRIVE not in tvm.ir.Op.list_op_names():  # once a process
    _ffi_api.RegisterOp(ARRIVE, "a CTA's ticket at a shared arrival counter (gdn_tvm.ops.common.arrive)")
    tvm.ir.register_op_attr(ARRIVE, "TCallEffectKind", _OPAQUE)
    register_intrin_lowering(
        ARRIVE,
        "cuda",
        f=lambda call: cuda_func_call("gdn_tvm_arrive", call.args[0], source_code=_ARRIVE_CUDA, return_type="int32"),
    )
    # A CPU build runs the arriving CTAs one after another in index order (their loop serial), so the ticket a CTA
    # draws is its index: no counter is touched.
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
