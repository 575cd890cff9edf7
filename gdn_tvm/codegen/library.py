"""Compile a scheduled IRModule for a target and export it as one shared library.

For CUDA the library must carry compiled device code: TVM compiles it at build time only when its CUDA
runtime is loaded (a driver, or the stub of `cuda_stub`); otherwise it silently keeps the source, which the
GPU machine would then JIT at every load. That case is an error here.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import tvm

from gdn_tvm.codegen.compile import compile_mod, is_in_place, uses_warp_memory, writes_state_pool


def export_library(mod: tvm.IRModule, target: tvm.target.Target, path: Path) -> None:
    """`mod` (one PrimFunc per exported function name) compiled for `target` into the shared library `path`.

    In-place functions are compiled apart (without no-alias, see `compile.is_in_place`) so that the others keep
    it, those among them writing a slot pool's state apart again (streaming stores, `compile.writes_state_pool`),
    and so are those with warp memory (their own pipeline); the other modules are imported into the first and all
    are exported together.
    """
    groups: dict[tuple[bool, bool, bool], dict] = {}
    for gv, func in mod.functions_items():
        one = tvm.IRModule({gv: func})
        groups.setdefault((is_in_place(one), writes_state_pool(one), uses_warp_memory(one)), {})[gv] = func
    first, *rest = executables = [compile_mod(tvm.IRModule(funcs), target) for funcs in groups.values()]
    device = [m for ex in executables for m in ex.mod.imports if m.kind == "cuda"]
    if target.kind.name == "cuda" and not (device and all(m.is_runnable() for m in device)):
        raise RuntimeError(
            "the CUDA module holds source, not compiled device code: TVM's CUDA runtime is not loaded "
            "(no libcuda.so.1); build through gdn_tvm.codegen.cuda_stub"
        )
    for ex in rest:
        first.mod.import_module(ex.mod)
    first.export_library(str(path))


def cuda_compile_mode() -> str:
    """How TVM compiles CUDA here: `TVM_CUDA_COMPILE_MODE` (nvrtc, the default, makes a cubin; nvcc a fatbin)."""
    return os.environ.get("TVM_CUDA_COMPILE_MODE", "nvrtc")


def cuda_compiler(mode: str | None = None) -> str:
    """`mode` (default: this process's, `cuda_compile_mode`) with its CUDA release, e.g. "nvrtc 13.0": the same
    kernel source runs at different speeds from different releases (the pinned NVRTC is the one the tuner timed)."""
    mode = mode or cuda_compile_mode()
    if mode == "nvrtc":
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        return f"nvrtc {major}.{minor}"
    found = re.search(
        r"release (\d+\.\d+)", subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout
    )
    return f"nvcc {found.group(1) if found else '?'}"
