"""Schedule and compile registry ops in process."""

from __future__ import annotations

import contextlib
import os
import threading

import tvm
import tvm_ffi
from tvm import s_tir, tirx
from tvm.s_tir.pipeline import default_s_tir_pipeline

from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import IN_PLACE_ATTR, Op, get, workload_groups
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.target import device_of

IN_PLACE_PIPELINE = "gdn_tvm_in_place"
WARP_PIPELINE = "gdn_tvm_warp_memory"
MAX_WARP_BUFFERS = 16  # LowerWarpMemory rounds a module may need (one per warp buffer): a bound, not a guess
STATE_POOL_OUT = "state_out"  # the parameter of a slot pool's state written in place (ops: delta rule, conv)
STREAMING_STORES = ("--def-store-cache=cs",)  # ptxas: stores without a cache operator become st.global.cs
PTXAS_ENV = "TVM_CUDA_PTXAS_EXTRA_OPTS"  # extra ptxas flags TVM's CUDA compile callback reads at each compile
_PTXAS_LOCK = threading.Lock()  # the flags are process environment: one compile sets them at a time


@tirx.transform.prim_func_pass(opt_level=0, name="gdn_tvm.DropNoAlias")
def _drop_no_alias(func, _mod, _ctx):
    """TVM's host/device split marks every device kernel no-alias (`__restrict__`, `ld.global.nc`);
    a state passed as both `state` and `state_out` is aliased, so its kernels must not be."""
    return func.with_attr("tirx.noalias", False)


def _in_place_pipeline(**kwargs):
    pipeline, finalize_host, finalize_device = default_s_tir_pipeline(**kwargs)

    def device_passes():
        return tvm.ir.transform.Sequential([finalize_device(), _drop_no_alias])

    return pipeline, finalize_host, device_passes


tirx.register_tir_pipeline(IN_PLACE_PIPELINE, _in_place_pipeline)


@tvm.transform.module_pass(opt_level=0, name="gdn_tvm.LowerEveryWarpBuffer")
def _lower_every_warp_buffer(mod, _ctx):
    """TVM 0.27's LowerWarpMemory rewrites one warp buffer of a nest of allocations a run (the first; its
    siblings keep their 32-lane size): run it until nothing changes."""
    lower = tirx.transform.LowerWarpMemory()
    for _ in range(MAX_WARP_BUFFERS):
        lowered = lower(mod)
        if tvm_ffi.structural_equal(lowered, mod):
            return mod
        mod = lowered
    raise ValueError(f"more than {MAX_WARP_BUFFERS} warp buffers in one kernel")


def _warp_pipeline(**kwargs):
    pipeline, finalize_host, finalize_device = default_s_tir_pipeline(**kwargs)

    def device_passes():
        return tvm.ir.transform.Sequential([_lower_every_warp_buffer, finalize_device()])

    return pipeline, finalize_host, device_passes


tirx.register_tir_pipeline(WARP_PIPELINE, _warp_pipeline)


def uses_warp_memory(mod: tvm.IRModule) -> bool:
    """True when a function of `mod` holds warp-scope buffers (tensor-core fragments): its kernels are built with
    `WARP_PIPELINE` and `_warp_context`."""
    return any(
        isinstance(f.body, s_tir.SBlockRealize) and any(b.scope() == "warp" for b in f.body.block.alloc_buffers)
        for f in mod.functions.values()
        if isinstance(f, tirx.PrimFunc)
    )


def is_in_place(mod: tvm.IRModule) -> bool:
    """True when a function of `mod` updates a state in place (marked by `Op.definition`)."""
    return any(bool(f.attrs and f.attrs.get(IN_PLACE_ATTR)) for f in mod.functions.values())


def writes_state_pool(mod: tvm.IRModule) -> bool:
    """True when a function of `mod` writes a slot pool's state in place (a `STATE_POOL_OUT` parameter): the next
    read of those rows is the next step's, after every weight of the model has streamed through L2, so its CUDA
    kernels store with evict-first (`STREAMING_STORES`) rather than displace what the kernels after it read. H200,
    the delta rule at qwen3.5-4b: B=1 3.41 -> 3.03 us, B=8 10.92 -> 10.61, within 0.4% from B=128; evict-first
    loads too were slower from B=32 (docs/design.md "Streaming stores")."""
    return any(
        p.name == STATE_POOL_OUT for f in mod.functions.values() if isinstance(f, tirx.PrimFunc) for p in f.params
    )


def ptxas_flags(mod: tvm.IRModule) -> tuple[str, ...]:
    """The ptxas flags `compile_mod` adds when it compiles `mod` for CUDA (a build's manifest lists them)."""
    return STREAMING_STORES if writes_state_pool(mod) else ()


@contextlib.contextmanager
def _extra_ptxas_flags(flags: tuple[str, ...]):
    """`flags` added to the ptxas flags of the CUDA compiles inside (both NVRTC and nvcc read `PTXAS_ENV`)."""
    if not flags:
        yield
        return
    with _PTXAS_LOCK:
        before = os.environ.get(PTXAS_ENV)
        os.environ[PTXAS_ENV] = " ".join([*([before] if before else []), *flags])
        try:
            yield
        finally:
            if before is None:
                del os.environ[PTXAS_ENV]
            else:
                os.environ[PTXAS_ENV] = before


def _warp_context() -> tvm.transform.PassContext:
    """The current pass context with TIR's common-subexpression pass off (LowerWarpMemory cannot read the indices it
    binds to lets) and the copies of a software pipeline's async stages made `cp.async`."""
    outer = tvm.transform.PassContext.current()
    return tvm.transform.PassContext(
        opt_level=outer.opt_level,
        required_pass=list(outer.required_pass),
        disabled_pass=list(outer.disabled_pass),
        instruments=list(outer.instruments),
        config={**outer.config, "tirx.disable_cse_tir": True, "tirx.use_async_copy": True},
    )


def compile_mod(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Executable:
    """`tvm.compile` inside the target's scope (the CUDA compile callback reads `Target.current()`),
    without no-alias assumptions for in-place kernels, with `ptxas_flags` (streaming stores where a slot pool's
    state is written).

    A CUDA build without device code is refused: TVM compiles a function whose loops bind no GPU threads for the
    host, and calling it on device pointers segfaults (dlight leaves what no rule fits unscheduled)."""
    warp = uses_warp_memory(mod)
    if warp and is_in_place(mod):
        raise ValueError("an in-place kernel with warp memory: no pipeline builds both")
    pipeline = WARP_PIPELINE if warp else IN_PLACE_PIPELINE if is_in_place(mod) else "default"
    flags = ptxas_flags(mod) if target.kind.name == "cuda" else ()
    with target, _warp_context() if warp else contextlib.nullcontext(), _extra_ptxas_flags(flags):
        ex = tvm.compile(mod, target=target, tir_pipeline=pipeline)
    if target.kind.name == "cuda" and not any(m.kind == "cuda" for m in ex.mod.imports):
        raise ValueError(
            f"{', '.join(str(g.name_hint) for g in mod.get_global_vars())}: no CUDA kernel was "
            "generated (no loop is bound to GPU threads)"
        )
    return ex


def compile_op(op: Op, cfg: DecodeConfig, target: tvm.target.Target, **knobs) -> Kernel:
    """Build `op` for `cfg` with its hand schedule for `target` and wrap it as a checked `Kernel`; a library call
    on `target` (`Op.compiled`) is the library's function instead (cuBLAS: `runtime.cublas`)."""
    if not op.compiled(target.kind.name):
        from gdn_tvm.runtime import cublas

        dev = device_of(target)
        device = (dev.dlpack_device_type(), dev.index)
        return Kernel(op.name, cublas.gemm_kernel(op.signature(cfg), device), op.signature(cfg), device)
    return compile_func(op, cfg, op.schedule(cfg, target.kind.name, **knobs).mod["main"], target)


def compile_func(op: Op, cfg: DecodeConfig, func: tirx.PrimFunc, target: tvm.target.Target) -> Kernel:
    """Build a scheduled PrimFunc of `op` for `cfg` and wrap it as a checked `Kernel`."""
    ex = compile_mod(tvm.IRModule({"main": func}), target)
    dev = device_of(target)
    return Kernel(op.name, ex["main"], op.signature(cfg), (dev.dlpack_device_type(), dev.index))


def dlight_schedule(op: Op, cfg: DecodeConfig, target: tvm.target.Target) -> tirx.PrimFunc:
    """`op` scheduled by TVM's dlight default rules (the untuned baseline). Raises ScheduleError from a rule,
    ValueError where a rule failed an assertion or where every rule passed the function by: dlight then leaves it
    unscheduled, and TVM would compile it for the host."""
    from tvm.s_tir import dlight as dl

    rules = (dl.gpu.GEMV(), dl.gpu.LowBatchGEMV(), dl.gpu.Reduction(), dl.gpu.GeneralReduction(), dl.gpu.Fallback())
    try:
        with target:
            func = dl.ApplyDefaultSchedule(*rules)(tvm.IRModule({"main": op.definition(cfg)}))["main"]
    except AssertionError as err:  # a rule's own analysis (GEMV's epilogue check)
        raise ValueError(f"{op.name}: a dlight rule failed an assertion: {err}") from None
    if not (func.attrs and func.attrs.get("tirx.is_scheduled")):
        raise ValueError(f"{op.name}: no dlight rule applies")
    host = host_loops(func.body)
    if host:
        raise ValueError(f"{op.name}: dlight leaves loops {', '.join(host)} on the host (they read device memory)")
    return func


def host_loops(stmt: tirx.Stmt) -> list[str]:
    """The outermost loops of a scheduled body that no thread binds and that do more than launch kernels: for CUDA
    they would run on the host. dlight's fallback schedules the blocks nested in a per-(lane, head) block one by one
    and leaves the loops around them (which read positions from device memory) serial. A loop whose body is only
    launches is a chain of them (`sample`), its counter the only host value."""
    if isinstance(stmt, tirx.SeqStmt):
        return [name for s in stmt.seq for name in host_loops(s)]
    if isinstance(stmt, s_tir.stmt.SBlockRealize):
        return host_loops(stmt.block.body)
    if isinstance(stmt, tirx.For):
        return [] if stmt.kind == tirx.ForKind.THREAD_BINDING or _launches_only(stmt.body) else [stmt.loop_var.name]
    return host_loops(stmt.body) if isinstance(stmt, tirx.DeclBuffer | tirx.AllocBuffer | tirx.AttrStmt) else []


def _launches_only(stmt: tirx.Stmt) -> bool:
    """`stmt` is kernel launches (loops bound to blockIdx), in sequence or in loops of them, and nothing else."""
    if isinstance(stmt, tirx.SeqStmt):
        return all(_launches_only(s) for s in stmt.seq)
    if isinstance(stmt, s_tir.stmt.SBlockRealize):
        return _launches_only(stmt.block.body)
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.THREAD_BINDING:
        return stmt.thread_binding.thread_tag.startswith("blockIdx")
    if isinstance(stmt, tirx.For):
        return _launches_only(stmt.body)
    return isinstance(stmt, tirx.DeclBuffer | tirx.AttrStmt) and _launches_only(stmt.body)


def compile_dlight(op: Op, cfg: DecodeConfig, target: tvm.target.Target) -> Kernel:
    """`op` with its dlight schedule (`dlight_schedule`), compiled and wrapped as a checked `Kernel`."""
    return compile_func(op, cfg, dlight_schedule(op, cfg, target), target)


def build_kernels(cfg: DecodeConfig, target: tvm.target.Target, names: list[str]) -> dict[str, Kernel]:
    """Hand-scheduled kernels for `names`, compiled once per distinct workload key (library calls on `target`: the
    library's functions)."""
    kernels = {}
    for group in workload_groups(cfg, target.kind.name, names).values():
        built = compile_op(get(group[0]), cfg, target)
        kernels.update({name: Kernel(name, built.func, get(name).signature(cfg), built.device) for name in group})
    kernels |= {name: compile_op(get(name), cfg, target) for name in names if name not in kernels}
    return {name: kernels[name] for name in names}
