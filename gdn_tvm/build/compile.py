"""Schedule and compile registry ops in process."""

from __future__ import annotations

import tvm

from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import Op, get
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.target import device_of


def compile_mod(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Executable:
    """`tvm.compile` inside the target's scope (the CUDA compile callback reads `Target.current()`)."""
    with target:
        return tvm.compile(mod, target=target)


def compile_op(op: Op, cfg: DecodeConfig, target: tvm.target.Target, **knobs) -> Kernel:
    """Build `op` for `cfg` with its hand schedule for `target` and wrap it as a checked `Kernel`."""
    sch = op.schedule(cfg, target.kind.name, **knobs)
    ex = compile_mod(sch.mod, target)
    dev = device_of(target)
    return Kernel(op.name, ex["main"], op.signature(cfg), (dev.dlpack_device_type(), dev.index))


def build_kernels(cfg: DecodeConfig, target: tvm.target.Target, names: list[str]) -> dict[str, Kernel]:
    """Hand-scheduled kernels for `names`, compiled once per distinct workload key."""
    by_key: dict[str, Kernel] = {}
    kernels = {}
    for name in names:
        op = get(name)
        key = op.workload_key(cfg, target.kind.name)
        if key not in by_key:
            by_key[key] = compile_op(op, cfg, target)
        kernels[name] = Kernel(name, by_key[key].func, op.signature(cfg), by_key[key].device)
    return kernels
