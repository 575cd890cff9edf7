"""CUDA export on a machine without a GPU, with the device code compiled at build time.

`libtvm_runtime_cuda.so` links `libcuda.so.1`; without a driver it fails to load (silently) and TVM keeps CUDA
source only. A stub `libcuda.so.1` whose entry points all fail lets it load, so TVM's compile callback runs (the
pinned NVRTC for the target's arch, or nvcc where TVM_CUDA_COMPILE_MODE says so) and the exported library embeds
the cubin. The stub cannot run anything: it is only put on `LD_LIBRARY_PATH` of a subprocess
(`python -m gdn_tvm.codegen.cuda_stub`) that compiles and exports a saved IRModule. On a GPU machine none of this is
needed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import tvm

from gdn_tvm.codegen.library import export_library

# What libtvm_runtime_cuda.so (TVM 0.27) imports from libcuda.so.1; each fails with CUDA_ERROR_NO_DEVICE.
SYMBOLS = (
    "cuDeviceGetName", "cuFuncSetAttribute", "cuGetErrorName", "cuGetErrorString", "cuLaunchKernelEx",
    "cuModuleGetFunction", "cuModuleLoadData", "cuModuleUnload", "cuTensorMapEncodeTiled",
)  # fmt: skip
CUDA_ERROR_NO_DEVICE = 100


def build_stub(folder: Path) -> Path:
    """`folder/libcuda.so.1`, compiled with gcc from a generated C file (kept when it is already there)."""
    lib = folder / "libcuda.so.1"
    if lib.exists():
        return lib
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "libcuda_stub.c"
    body = "".join(f"int {name}(void) {{ return {CUDA_ERROR_NO_DEVICE}; }}\n" for name in SYMBOLS)
    source.write_text("/* A stub CUDA driver: lets TVM's CUDA runtime load to compile, never to run. */\n" + body)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    return lib


def export_with_stub(mod: tvm.IRModule, target: tvm.target.Target, path: Path, stub_folder: Path) -> str:
    """Export `mod` for `target` to `path` in a subprocess running on the stub driver; the compile mode used."""
    stub = build_stub(stub_folder)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(stub.parent), env.get("LD_LIBRARY_PATH")]))
    env.setdefault("TVM_CUDA_COMPILE_MODE", "nvrtc")  # the pinned NVRTC, as tuning compiles
    env.setdefault("CUDA_PATH", "/usr/local/cuda")  # NVRTC's headers (a wrapper nvcc on PATH misleads TVM)
    with tempfile.TemporaryDirectory() as tmp:
        saved = Path(tmp) / "mod.json"
        saved.write_text(tvm.ir.save_json(mod))
        cmd = [sys.executable, "-m", "gdn_tvm.codegen.cuda_stub", str(saved), str(target), str(path)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"CUDA export with the stub driver failed:\n{done.stdout}{done.stderr}")
    return env["TVM_CUDA_COMPILE_MODE"]


def main(argv: list[str]) -> None:
    saved, target, path = argv
    export_library(tvm.ir.load_json(Path(saved).read_text()), tvm.target.Target(json.loads(target)), Path(path))


if __name__ == "__main__":
    main(sys.argv[1:])
