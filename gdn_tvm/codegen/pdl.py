"""Programmatic dependent launch (sm_90): a CUDA kernel that overlaps the one before it by reading its weights early.

Each kernel of a function with a prefetch plan starts with three steps before its own body:
  1. L2 prefetches of the first bytes of each of its weights (`prefetch.global.L2`, spread over every thread of
     the grid), which read nothing another kernel writes;
  2. `griddepcontrol.wait`: until the kernel before it in the stream has finished and its writes are visible;
  3. `griddepcontrol.launch_dependents`: from here the next kernel may launch, run its own step 1 beside this
     kernel's body, and wait at its step 2.
The kernel is launched with CUDA's programmatic-stream-serialization attribute (TVM's launch tag, below), which a
stream capture records as a programmatic edge of the graph. Launched without it (another runtime, or a kernel
before it that is no kernel), the wait returns at once and the order is the stream's. Since the trigger follows
the wait, at most the next kernel runs ahead: kernel N+1 launches once every CTA of N is past its wait, that is
once N-1 has finished.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator, Mapping, Sequence

import tvm
from tvm import tirx
from tvm.backend.cuda.op import cuda_func_call

PREFETCH_ATTR = "gdn_tvm.prefetch"  # on a PrimFunc: {weight buffer name: bytes}; `mark` sets it
LAUNCH_TAG = "tirx.use_programtic_dependent_launch"  # TVM 0.27's spelling (runtime/metadata.h)
DYNAMIC_SHARED_TAG = "tirx.use_dyn_shared_memory"  # must stay the last launch tag
LINE = 128  # bytes an L2 prefetch covers

_PREFETCH = (
    "static __device__ __forceinline__ void gdn_prefetch_l2(const void* base, long long bytes) {\n"
    "  const long long threads = (long long)blockDim.x * blockDim.y * blockDim.z;\n"
    "  const long long first = (((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * threads\n"
    "      + ((long long)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;\n"
    "  const long long stride = (long long)gridDim.x * gridDim.y * gridDim.z * threads;\n"
    f"  for (long long i = first * {LINE}; i < bytes; i += stride * {LINE}) {{\n"
    '    asm volatile("prefetch.global.L2 [%0];" :: "l"((const char*)base + i));\n'
    "  }\n"
    "}\n"
)
_WAIT = (
    "static __device__ __forceinline__ void gdn_grid_wait() {\n"
    '  asm volatile("griddepcontrol.wait;" ::: "memory");\n'
    "}\n"
)
_TRIGGER = (
    "static __device__ __forceinline__ void gdn_grid_trigger() {\n"
    '  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n'
    "}\n"
)

# While `codegen.compile` compiles a module: function name -> {weight buffer name: bytes to prefetch}, of the functions
# `mark`ed; the device pass of each of its pipelines reads it.
_PLAN: contextvars.ContextVar[Mapping[str, Mapping[str, int]]] = contextvars.ContextVar("gdn_tvm_pdl")


def mark(func: tirx.PrimFunc, signature: Sequence, prefetch_bytes: int) -> tirx.PrimFunc:
    """`func` to be built for programmatic dependent launch, prefetching the first `prefetch_bytes` (0: none) of each
    weight of its `signature` (`Arg`s of role "weight")."""
    if prefetch_bytes < 0:
        raise ValueError(f"prefetch_bytes must be >= 0, got {prefetch_bytes}")
    weights = {a.name: min(a.nbytes, prefetch_bytes) for a in signature if a.role == "weight"}
    return func.with_attr(PREFETCH_ATTR, weights)


@contextlib.contextmanager
def planned(mod: tvm.IRModule) -> Iterator[None]:
    """Within: the kernels of `mod`'s `mark`ed functions are built for programmatic dependent launch."""
    plan = {}
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and func.attrs and PREFETCH_ATTR in func.attrs:
            name = str(func.attrs.get("global_symbol", gv.name_hint))
            plan[name] = {str(k): int(v) for k, v in func.attrs[PREFETCH_ATTR].items()}
    token = _PLAN.set(plan)
    try:
        yield
    finally:
        _PLAN.reset(token)


def _owner(kernel: str, plan: Mapping[str, Mapping[str, int]]) -> str | None:
    """The function of `plan` whose kernel `kernel` is (`<function>_kernel`, `<function>_kernel_<n>`)."""
    return next((f for f in plan if re.fullmatch(rf"{re.escape(f)}_kernel(_\d+)?", kernel)), None)


def _call(name: str, source: str, *args) -> tirx.Evaluate:
    """A statement calling the device function `name` defined by `source`."""
    return tirx.Evaluate(cuda_func_call(name, *args, source_code=source))


@tirx.transform.prim_func_pass(opt_level=0, name="gdn_tvm.ProgrammaticLaunch")
def programmatic_launch(func: tirx.PrimFunc, _mod, _ctx) -> tirx.PrimFunc:
    """A device kernel of a planned function: prefetch, wait and trigger before its body, and the launch tag."""
    plan = _PLAN.get({})
    params = func.attrs.get("tirx.kernel_launch_params") if func.attrs else None
    owner = _owner(str(func.attrs.get("global_symbol", "")), plan) if params is not None else None
    if params is None or owner is None:
        return func
    by_name = {p.name: p for p in func.params}
    steps = [
        _call("gdn_prefetch_l2", _PREFETCH, by_name[f"{w}_ptr"], tirx.const(n, "int64"))
        for w, n in plan[owner].items()
        if n > 0 and f"{w}_ptr" in by_name
    ]
    steps += [_call("gdn_grid_wait", _WAIT), _call("gdn_grid_trigger", _TRIGGER)]
    tags = [str(t) for t in params]
    dynamic = DYNAMIC_SHARED_TAG in tags
    tags = [t for t in tags if t != DYNAMIC_SHARED_TAG] + [LAUNCH_TAG] + [DYNAMIC_SHARED_TAG] * dynamic
    return func.with_body(tirx.SeqStmt([*steps, func.body])).with_attr("tirx.kernel_launch_params", tags)
