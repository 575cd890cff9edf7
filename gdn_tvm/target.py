"""Compilation targets: llvm for the CPU path, sm_90 CUDA for the H200."""

from __future__ import annotations

import os

import tvm

H200 = {
    "kind": "cuda",
    "arch": "sm_90",
    "max_threads_per_block": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
    "l2_cache_size_bytes": 52428800,
}


def llvm(num_cores: int | None = None) -> tvm.target.Target:
    """The host CPU, parallel over `num_cores` (default: this machine's)."""
    return tvm.target.Target({"kind": "llvm", "num-cores": num_cores or os.cpu_count() or 1})


def cuda(num_cores: int | None = None) -> tvm.target.Target:
    """The H200 (sm_90), with an llvm host."""
    return tvm.target.Target({**H200, "host": {"kind": "llvm", "num-cores": num_cores or os.cpu_count() or 1}})


def gpu_present() -> bool:
    """True when a CUDA device is visible to the TVM runtime."""
    return tvm.runtime.enabled("cuda") and tvm.cuda(0).exist


def default() -> tvm.target.Target:
    """The GPU if there is one, else the CPU."""
    return cuda() if gpu_present() else llvm()


def by_name(name: str) -> tvm.target.Target:
    """`"llvm"`, `"cuda"` or `"auto"` (GPU if present)."""
    makers = {"llvm": llvm, "cuda": cuda, "auto": default}
    if name not in makers:
        raise ValueError(f"target must be one of {sorted(makers)}, got {name!r}")
    return makers[name]()


def device_of(target: tvm.target.Target) -> tvm.runtime.Device:
    """The runtime device a target's kernels run on."""
    return tvm.cuda(0) if target.kind.name == "cuda" else tvm.cpu(0)
