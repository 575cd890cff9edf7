"""Compilation targets (llvm for the CPU path, sm_90 CUDA for the H200) and the one home of GPU facts.

A `GpuSpec` holds what schedules, layout rules, the tuner's timing and the benchmarks need to know of a GPU. The
CUDA target is built from it, and `gpu_spec(target)` reads it back from the target: its attributes where TVM has
them (shared memory, L2, warp size), the rest (SMs, threads an SM holds, copy bandwidth) from the row of `GPUS`
named by the target's `model`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import tvm


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's facts. `peak_gbps`: the copy bandwidth the benchmarks rate against (measured, not the datasheet's)."""

    model: str
    arch: str
    sms: int
    threads_per_sm: int
    max_threads_per_block: int
    shared_memory_per_block: int  # bytes a CTA may take without opting in
    shared_memory_optin: int  # bytes a CTA may take when its kernel opts in (dynamic shared memory)
    registers_per_block: int
    l2_bytes: int
    peak_gbps: float
    warp: int = 32

    @property
    def resident_threads(self) -> int:
        """Threads the whole GPU holds at once: one wave."""
        return self.sms * self.threads_per_sm


GPUS = {
    # H200 SXM: 132 SMs of 2048 threads, 227 KB of shared memory a CTA that opts in, 50 MiB L2; 4.3 TB/s is the
    # measured copy peak (a float4 vector add reached 4.09 TB/s; the datasheet says 4.8).
    "h200": GpuSpec("h200", "sm_90", 132, 2048, 1024, 49152, 232448, 65536, 50 * 2**20, 4300.0),
}
DEFAULT_GPU = GPUS["h200"]


def cuda(num_cores: int | None = None, gpu: GpuSpec = DEFAULT_GPU) -> tvm.target.Target:
    """The CUDA target of `gpu` (default the H200, sm_90), with an llvm host."""
    return tvm.target.Target(
        {
            "kind": "cuda",
            "model": gpu.model,
            "arch": gpu.arch,
            "max_threads_per_block": gpu.max_threads_per_block,
            "max_shared_memory_per_block": gpu.shared_memory_per_block,
            "thread_warp_size": gpu.warp,
            "registers_per_block": gpu.registers_per_block,
            "l2_cache_size_bytes": gpu.l2_bytes,
            "host": {"kind": "llvm", "num-cores": num_cores or os.cpu_count() or 1},
        }
    )


def gpu_spec(target: tvm.target.Target | None = None) -> GpuSpec:
    """The spec of a CUDA target (default: `cuda()`'s), checked against the target's own attributes."""
    target = target or cuda()
    attrs = target.attrs
    model = str(attrs.get("model", ""))
    if model not in GPUS:
        raise ValueError(f"target {target}: no GPU spec for model {model!r} (known: {', '.join(GPUS)})")
    spec = GPUS[model]
    have = {
        "arch": str(attrs["arch"]),
        "shared_memory_per_block": int(attrs["max_shared_memory_per_block"]),
        "l2_bytes": int(attrs["l2_cache_size_bytes"]),
        "warp": int(attrs["thread_warp_size"]),
    }
    wrong = {k: v for k, v in have.items() if getattr(spec, k) != v}
    if wrong:
        raise ValueError(f"target {target} disagrees with the {model} spec on {wrong}")
    return spec


def llvm(num_cores: int | None = None) -> tvm.target.Target:
    """The host CPU, parallel over `num_cores` (default: this machine's)."""
    return tvm.target.Target({"kind": "llvm", "num-cores": num_cores or os.cpu_count() or 1})


def gpu_present() -> bool:
    """True when a CUDA device is visible to the TVM runtime."""
    return tvm.runtime.enabled("cuda") and tvm.cuda(0).exist


def memory_bytes(device: tvm.runtime.Device) -> int:
    """Bytes of memory `device` has for a step: a CUDA GPU's global memory; for the CPU, what the host can give
    without swapping (Linux's MemAvailable: free memory and reclaimable caches), else its physical memory."""
    if device.dlpack_device_type() == tvm.cuda(0).dlpack_device_type():
        return int(device.total_global_memory)
    try:
        with open("/proc/meminfo") as info:
            return next(int(line.split()[1]) * 1024 for line in info if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):  # not Linux, or a kernel without the field
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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
