"""TVM's CUDA kernels run on the CPU, so tests without a GPU check their numerics against the references.

`lower` compiles a scheduled op (a hand schedule or a tuning record's) as the build does and returns its CUDA source
with its launches, read
from the host function TVM's `SplitHostDevice` leaves (kernel names in launch order, which `main` parameter each
kernel argument is, grid and block extents). `launcher` compiles that source with `cuda_emu.h` (a CUDA shim whose
block threads are fibers: see there) into a shared library, cached by content, and calls its kernels through a
trampoline per kernel; `emulated` wraps that as a host `Kernel`, so `gdn_tvm.verify.check_kernel` runs it like any
other build: in place on host arrays, alias args bound to their state.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import tirx

from gdn_tvm.codegen.compile import compile_mod
from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import Op
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.signature import HOST, address
from gdn_tvm.target import cuda

SHIM = Path(__file__).with_name("cuda_emu.h")
CACHE = Path(tempfile.gettempdir()) / f"gdn_tvm-cuda-emu-{os.getuid()}"
# Hidden symbols: each library keeps its own shim state (GCC would otherwise share inline variables process-wide).
CXX = ["g++", "-std=c++17", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-fvisibility=hidden"]
SCALARS = {"int": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float}
LAUNCHING = threading.Lock()  # the shim runs one launch at a time (its state and `__shared__` storage are static)
KERNEL_DEF = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(([^)]*)\) \{')


class NotEmulated(Exception):
    """The kernels use something the emulator does not model (the message says what)."""


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the host function: `args[i]` is the index of the `main` parameter passed as the
    kernel's i-th argument; `grid` and `block` are (x, y, z) extents."""

    kernel: str
    args: tuple[int, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@tvm.instrument.pass_instrument
class _AfterSplit:
    """A pass instrument keeping the module as `tirx.SplitHostDevice` leaves it (host `main` launching kernels)."""

    mod: tvm.IRModule | None = None

    def run_after_pass(self, mod, info):
        if info.name == "tirx.SplitHostDevice":
            self.mod = mod


def lower(mod: tvm.IRModule) -> tuple[str, list[Launch]]:
    """A scheduled module (`main`) compiled for CUDA as the build compiles it: its CUDA source and its launches in
    the host's order."""
    split = _AfterSplit()
    with tvm.transform.PassContext(instruments=[split]):
        executable = compile_mod(mod, cuda())
    (device,) = [m for m in executable.mod.imports if m.kind == "cuda"]
    return device.inspect_source("cuda"), _launches(split.mod["main"])


def _launches(main: tirx.PrimFunc) -> list[Launch]:
    """The `tirx.call_ffi_kernel` calls of the host function, which declares buffer views and launches, no more."""
    stmts = main.body.seq if isinstance(main.body, tirx.SeqStmt) else [main.body]
    views: list[tirx.DeclBuffer] = []
    launches = []
    for stmt in stmts:
        if isinstance(stmt, tirx.DeclBuffer):
            views.append(stmt)
        elif isinstance(stmt, tirx.Evaluate) and stmt.value.op.name == "tirx.call_ffi_kernel":
            launches.append(_launch(stmt.value, main.params, views))
        else:
            raise NotEmulated(f"host code other than launches: {type(stmt).__name__}")
    return launches


def _launch(call: tvm.ir.Call, params, views) -> Launch:
    """`call_ffi_kernel(name, *kernel args, *extents, launch_params=tags)`: the extents are what the runtime passes to
    the CUDA launch, one per tag (`blockIdx.x`, `threadIdx.y`, ...; an axis without a tag has extent 1)."""
    tags = list(call.attrs.launch_params)
    if "tirx.use_dyn_shared_memory" in tags:
        raise NotEmulated("dynamic shared memory")
    n_args = len(call.args) - 1 - len(tags)
    extents = call.args[1 + n_args :]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        raise NotEmulated(f"launch extents known only at run time: {list(extents)}")
    dims = {tag: int(e) for tag, e in zip(tags, extents, strict=True)}
    grid = tuple(dims.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(dims.get(f"threadIdx.{a}", 1) for a in "xyz")
    args = tuple(_param_index(a, params, views) for a in call.args[1 : 1 + n_args])
    return Launch(str(call.args[0].value), args, grid, block)


def _param_index(arg: tirx.Expr, params, views) -> int:
    """Which `main` parameter a kernel argument is: a scalar parameter itself, or the data of a buffer parameter
    (possibly through views declared on it)."""
    while isinstance(arg, tvm.ir.Call) and arg.op.name == "tirx.buffer_data":
        var = arg.args[0]
        arg = next((v.data for v in views if v.buffer.same_as(var)), var)
    for i, p in enumerate(params):
        if arg.same_as(p):
            return i
    raise NotEmulated(f"a kernel argument that is no parameter of main: {arg}")


def emulated(op: Op, cfg: DecodeConfig, source: str, launches: list[Launch]) -> Kernel:
    """A host `Kernel` of `op` at `cfg` running `launches` of `source` (as `lower` returns them) in the emulator:
    `kernel(**values)` checks the values as a build's kernel does and updates the host arrays in place."""
    return Kernel(op.name, launcher(source, launches), op.signature(cfg), HOST)


def launcher(source: str, launches: list[Launch]) -> Callable[..., None]:
    """A function running `launches` of `source` one after another on the values of `main`'s parameters, in
    order (arrays, whose data the kernels read and write, and scalars)."""
    types = _kernel_params(source)
    lib = _library(source, types)

    def run(*values) -> None:
        for launch in launches:
            cells = [_cell(t, values[i]) for t, i in zip(types[launch.kernel], launch.args, strict=True)]
            argv = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
            dims = (ctypes.c_uint * 6)(*launch.grid, *launch.block)
            with LAUNCHING:
                why = getattr(lib, f"emu_launch_{launch.kernel}")(argv, dims)
            if why:
                raise RuntimeError(f"{launch.kernel}: {why.decode()}")

    return run


def _cell(ctype: str, value) -> ctypes._SimpleCData:
    """`value` as the kernel parameter of C type `ctype`: a pointer to the array's data, or the scalar."""
    if ctype.endswith("*"):
        return ctypes.c_void_p(address(value))
    if ctype not in SCALARS:
        raise NotEmulated(f"kernel parameter type {ctype}")
    return SCALARS[ctype](value)


def _kernel_params(source: str) -> dict[str, list[str]]:
    """Each kernel's parameter C types, from its definition in `source`."""
    kernels = {}
    for name, params in KERNEL_DEF.findall(source):
        decls = [p.replace("__restrict__", "").split() for p in params.split(",")]
        kernels[name] = [" ".join(d[:-1]).replace(" *", "*") for d in decls]
    return kernels


def _library(source: str, kernels: dict[str, list[str]]) -> ctypes.CDLL:
    """`source` with a launcher per kernel, built against the shim (cached under `CACHE` by content)."""
    for name, types in kernels.items():
        call = ", ".join(f"*({t}*)a[{i}]" for i, t in enumerate(types))
        source += f"\nEMU_LAUNCHER({name}, {call})\n"
    shim = SHIM.read_text()
    key = hashlib.sha256("\0".join([shim, source, *CXX]).encode()).hexdigest()[:24]
    so = CACHE / f"{key}.so"
    if not so.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
            (Path(tmp) / "cuda.h").write_text(shim)
            (Path(tmp) / "cuda_bf16.h").write_text("#include <cuda.h>\n")  # the shim holds bf16 too
            (Path(tmp) / "kernel.cc").write_text(source)
            built = subprocess.run(
                [*CXX, "-I", tmp, "-o", f"{tmp}/kernel.so", f"{tmp}/kernel.cc"], capture_output=True, text=True
            )
            if built.returncode:
                raise RuntimeError(f"g++ failed on the emulated kernel:\n{built.stderr[-4000:]}")
            os.replace(f"{tmp}/kernel.so", so)
    lib = ctypes.CDLL(str(so))
    for name in kernels:
        getattr(lib, f"emu_launch_{name}").restype = ctypes.c_char_p
    return lib
