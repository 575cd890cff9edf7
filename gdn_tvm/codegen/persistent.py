"""Persistent fusion: one CUDA kernel from several scheduled ones, run back to back with grid barriers between.

At B = 1 a launch boundary costs 1.5-3 us besides a kernel's bytes (docs/design.md "The whole model"): the kernels'
ramps and tails, which programmatic dependent launch did not hide. `fuse` keeps each kernel's schedule (hand or
tuned) and changes only who runs it: a grid of `ctas` CTAs, all resident at once, in which CTA `p` runs CTAs
`p, p + ctas, ...` of the first kernel, waits at a grid barrier until every CTA has, then does the same for the next
kernel. The kernels must agree on their CTA shape (threadIdx extents) and use no dynamic shared memory; the barrier
needs every CTA resident, so `ctas` must not exceed what the GPU holds at once. On the H200 such kernels ran slower
than their graph-replayed launches (docs/design.md "Persistent kernels", `benchmarks.persistent`).

The barriers (`ops.common`'s `grid_sync`) count arrivals at `sync[0]` (barrier r of a launch waits for r * ctas)
and the CTAs' exits at `sync[1]` (`grid_exit`); the last CTA to exit sets both back to zero, so the next launch (a
replayed graph) finds them there. Before a barrier, each CTA may ask L2 for its share of tensors the next kernel
reads (`prefetch`: its weights), so that the CTAs done first keep memory busy while the last ones finish.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import tvm
from tvm import s_tir, tirx

from gdn_tvm.ops.common import GRID_EXIT, GRID_SYNC, PREFETCH_L2
from gdn_tvm.registry import IN_PLACE_ATTR


def fuse(funcs: Sequence[tirx.PrimFunc], ctas: int, prefetch: Sequence[Sequence[str]] | None = None) -> tirx.PrimFunc:
    """One PrimFunc running `funcs` (scheduled, a kernel each: a blockIdx.x loop) in order on `ctas` CTAs, with a
    grid barrier between each and the next; its parameters are theirs in order, then `sync` (int32 [2], zero before a
    launch and after it). Buffers one kernel writes and a later one reads are separate parameters bound to the same
    tensor: the PrimFunc is compiled without no-alias assumptions. `prefetch[i]`: names of kernel i's parameters
    whose bytes the CTAs ask L2 for, a share each, before the barrier ahead of kernel i (kernel 0 has none)."""
    prefetch = list(prefetch) if prefetch is not None else [[] for _ in funcs]
    if len(prefetch) != len(funcs) or prefetch[0]:
        raise ValueError(f"prefetch: a list of parameter names per kernel ({len(funcs)}), none for the first")
    cta = tirx.Var("cta", "int32")
    sync = tirx.decl_buffer((2,), "int32", name="sync")
    params: list = []
    allocs, parts, shape = [], [], None
    for i, func in enumerate(funcs):
        root = func.body.block
        kernel = root.body
        if not (isinstance(kernel, tirx.For) and _tag(kernel) == "blockIdx.x" and int(kernel.min) == 0):
            raise ValueError(f"kernel {i}: expected one kernel whose outermost loop is bound to blockIdx.x from 0")
        if any(p.same_as(q) for p in func.params for q in params):
            raise ValueError(f"kernel {i}: the PrimFunc of an earlier kernel (schedule each kernel afresh)")
        if any(b.scope() == "shared.dyn" for b in root.alloc_buffers):
            raise ValueError(f"kernel {i}: dynamic shared memory (its size a launch parameter of its own)")
        threads = _thread_extents(kernel.body)
        if shape is not None and threads != shape:
            raise ValueError(f"kernel {i}: CTAs of {threads} threads, where the kernels before have {shape}")
        shape = threads
        n = int(kernel.extent)
        step = tirx.Var(f"step{i}", "int32")
        index = cta + step * ctas
        body = tirx.SeqStmt([tirx.Bind(kernel.loop_var, index), kernel.body])  # its CTA index, now a step's
        # the CTA's share as a trip count, not a branch (TVM inserts no barrier under a condition); each step a block
        # of its own, which keeps that CTA-dependent trip count out of its reductions' loop nests
        steps = math.ceil(n / ctas) if n % ctas == 0 else tirx.floordiv(n - cta + ctas - 1, ctas)
        block = s_tir.SBlockRealize([], True, s_tir.SBlock([], [], [], f"kernel{i}", body))
        parts.append(tirx.For(step, 0, steps, tirx.ForKind.SERIAL, block))
        if i + 1 < len(funcs):
            parts += [_prefetch(p, ctas) for p in _params(funcs[i + 1], prefetch[i + 1], i + 1)]
            parts.append(tirx.Evaluate(tirx.call_intrin("int32", GRID_SYNC, tirx.address_of(sync[0]), ctas * (i + 1))))
        params += list(func.params)
        allocs += list(root.alloc_buffers)
    parts.append(tirx.Evaluate(tirx.call_intrin("int32", GRID_EXIT, tirx.address_of(sync[0]), ctas)))
    binding = tirx.IterVar(tvm.ir.Range(0, ctas), cta, tirx.IterVar.ThreadIndex, "blockIdx.x")
    loop = tirx.For(cta, 0, ctas, tirx.ForKind.THREAD_BINDING, tirx.SeqStmt(parts), thread_binding=binding)
    root = s_tir.SBlock([], [], [], "root", loop, alloc_buffers=allocs)
    fused = tirx.PrimFunc([*params, sync], s_tir.SBlockRealize([], True, root))
    fused = fused.with_attrs({"global_symbol": "main", "tirx.is_scheduled": True, IN_PLACE_ATTR: True})
    if _allreduces(fused) != sum(_allreduces(f) for f in funcs):
        raise ValueError("a reduction across threads would not be lowered in the fused kernel (its sums would race)")
    return fused


def _params(func: tirx.PrimFunc, names: Sequence[str], i: int) -> list:
    """The parameters of kernel `i` (`func`) named `names`."""
    by_name = {p.name: p for p in func.params}
    if unknown := [n for n in names if n not in by_name]:
        raise ValueError(f"prefetch: kernel {i} has no parameter {', '.join(unknown)}")
    return [by_name[n] for n in names]


def _prefetch(param, ctas: int) -> tirx.Stmt:
    """The calling CTA's share of `param`'s bytes asked of L2 (`ops.common`'s `prefetch_l2`)."""
    nbytes = math.prod(int(n) for n in param.shape) * tvm.DataType(param.dtype).bits // 8
    first = tirx.address_of(param[(0,) * len(param.shape)])
    return tirx.Evaluate(tirx.call_intrin("int32", PREFETCH_L2, first, tirx.const(nbytes, "int64"), ctas))


def _allreduces(func: tirx.PrimFunc) -> int:
    """The reductions across threads TVM lowers in `func` (a reduction it does not recognise stays a racing sum)."""
    lowered = s_tir.transform.LowerCrossThreadReduction()(tvm.IRModule({"main": func}))
    return lowered.script().count("tvm_thread_allreduce")


def _tag(loop: tirx.For) -> str:
    return loop.thread_binding.thread_tag if loop.thread_binding is not None else ""


def _thread_extents(stmt: tirx.Stmt) -> dict[str, int]:
    """threadIdx tag -> extent of the loops bound to it under `stmt` (each tag's loops must agree; no blockIdx loop:
    a kernel's grid is one-dimensional)."""
    extents: dict[str, int] = {}
    stack = [stmt]
    while stack:
        node = stack.pop()
        if isinstance(node, tirx.For) and _tag(node).startswith("blockIdx"):
            raise ValueError(f"a second grid dimension ({_tag(node)}) inside the kernel")
        if isinstance(node, tirx.For) and _tag(node).startswith("threadIdx"):
            tag, n = _tag(node), int(node.extent)
            if extents.setdefault(tag, n) != n:
                raise ValueError(f"loops bound to {tag} of {extents[tag]} and {n} threads")
        stack += _children(node)
    return extents


def _children(node) -> list:
    """The statements directly inside `node` (a scheduled kernel's loops, blocks, branches and sequences)."""
    if isinstance(node, tirx.SeqStmt):
        return list(node.seq)
    if isinstance(node, s_tir.SBlockRealize):
        return [node.block]
    if isinstance(node, s_tir.SBlock):
        return [node.body] + ([node.init] if node.init is not None else [])
    if isinstance(node, tirx.IfThenElse):
        return [node.then_case] + ([node.else_case] if node.else_case is not None else [])
    body = getattr(node, "body", None)  # loops, lets, attributes
    return [body] if isinstance(body, tirx.Stmt) else []
