"""TIR pieces that several ops share (not an op itself: the registry never imports it).

Each helper here is called in a `prim_func` body and expands a fresh `T.macro` there: TVM suffixes the block names
of a macro object's later expansions (`sumsq_1`), and block names are the schedules' interface.
"""

from __future__ import annotations

from tvm.script import tirx as T


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
