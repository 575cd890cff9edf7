"""TIR pieces that several ops share (not an op itself: the registry never imports it).

Each helper here is called in a `prim_func` body and expands a fresh `T.macro` there: TVM suffixes the block names
of a macro object's later expansions (`sumsq_1`), and block names are the schedules' interface.
"""

from __future__ import annotations

from tvm.script import tirx as T


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
