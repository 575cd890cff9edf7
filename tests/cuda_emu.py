"""TVM's CUDA kernels run on the CPU, so tests without a GPU check their numerics against the references.

`lower` compiles a scheduled op (a hand schedule or a tuning record's) as the build does and returns its CUDA source
with its launches, read
from the host function TVM's `SplitHostDevice` leaves (kernel names in launch order, which `main` parameter each
kernel argument is or which host loop counter's value, grid and block extents; host loops of constant extent around
launches unrolled). `launcher` compiles that source with `cuda_emu.h` (a CUDA shim whose
block threads are fibers: see there) into a shared library, cached by content, and calls its kernels through a
trampoline per kernel; `emulated` wraps that as a host `Kernel`, so `gdn_tvm.verify.check_kernel` runs it like any
other build: in place on host arrays, alias args bound to their state. Inline PTX becomes calls of the shim where it
models the instruction (`ldmatrix`, bf16 `mma`, `cp.async` and its groups, `prefetch.global.L2`; `griddepcontrol`,
nothing to do where launches run one after another: `_rewrite_asm`); any other stops the build with `NotEmulated`. A
kernel's dynamic shared memory becomes a `__shared__` array of the size its launch gives it.
"""

from __future__ import annotations

import codecs
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

import numpy as np
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
DYNAMIC_SHARED = re.compile(r"extern __shared__ ([^;\[]*?)(\w+) (\w+)\[\];")  # attributes, type, name
# What `_rewrite_asm` looks at: the asm keyword, and what it skips (comments, literals, preprocessor lines).
ASM_OR_SKIPPED = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|^[ \t]*#(?:[^\\\n]|\\.)*'
    r"|\b(?:__asm__|__asm|asm)\b",
    re.S | re.M,
)
ASM_CALL = re.compile(r"\b(?:__asm__|__asm|asm)\b[\s\w]*\(")  # an asm statement (in a macro too)
ASM_QUALIFIERS = re.compile(r"(?:\s*\b(?:__volatile__|__volatile|volatile|inline|goto)\b)*\s*\(")
LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'')
OPERAND = re.compile(r'\s*"([^"]*)"\s*(\(.*\))\s*', re.S)  # `"=r"(expression)`
LDMATRIX = re.compile(r"ldmatrix\.sync\.aligned\.m8n8\.x([124])(\.trans)?\.shared(?:::cta)?\.b16")
MMA_BF16 = "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
CP_ASYNC = re.compile(r"cp\.async\.(?:ca|cg)\.shared(?:::cta)?\.global")
WAIT_GROUP = re.compile(r"(\d+);")  # cp.async.wait_group's operand, a literal


class NotEmulated(Exception):
    """The kernels use something the emulator does not model (the message says what)."""


@dataclass(frozen=True)
class Counter:
    """A host loop counter's value passed to a kernel (a chain of launches, one an iteration)."""

    value: int


@dataclass(frozen=True)
class Launch:
    """One kernel launch of the host function: `args[i]` is the index of the `main` parameter passed as the
    kernel's i-th argument, or a `Counter` (a host loop's value at this launch); `grid` and `block` are (x, y, z)
    extents; `dynamic_shared` the bytes of its dynamic shared memory."""

    kernel: str
    args: tuple[int | Counter, ...]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_shared: int = 0


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
    """The `tirx.call_ffi_kernel` calls of the host function, which declares buffer views and launches (in loops of
    constant extent, unrolled), no more."""
    views: list[tirx.DeclBuffer] = []
    launches: list[Launch] = []

    def visit(stmt: tirx.Stmt, counters: dict) -> None:
        if isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                visit(s, counters)
        elif isinstance(stmt, tirx.DeclBuffer):
            views.append(stmt)
        elif isinstance(stmt, tirx.Evaluate) and stmt.value.op.name == "tirx.call_ffi_kernel":
            launches.append(_launch(stmt.value, main.params, views, counters))
        elif isinstance(stmt, tirx.For) and all(isinstance(e, tirx.IntImm) for e in (stmt.min, stmt.extent)):
            for value in range(int(stmt.min), int(stmt.min) + int(stmt.extent)):
                visit(stmt.body, counters | {stmt.loop_var: value})
        else:
            raise NotEmulated(f"host code other than launches: {type(stmt).__name__}")

    visit(main.body, {})
    return launches


def _launch(call: tvm.ir.Call, params, views, counters: dict) -> Launch:
    """`call_ffi_kernel(name, *kernel args, *extents, launch_params=tags)`: the extents are what the runtime passes to
    the CUDA launch, one per tag (`blockIdx.x`, `threadIdx.y`, ...; an axis without a tag has extent 1)."""
    tags = list(call.attrs.launch_params)
    n_args = len(call.args) - 1 - len(tags)
    extents = call.args[1 + n_args :]
    if not all(isinstance(e, tirx.IntImm) for e in extents):
        raise NotEmulated(f"launch extents known only at run time: {list(extents)}")
    dims = {tag: int(e) for tag, e in zip(tags, extents, strict=True)}
    grid = tuple(dims.get(f"blockIdx.{a}", 1) for a in "xyz")
    block = tuple(dims.get(f"threadIdx.{a}", 1) for a in "xyz")
    args = tuple(
        Counter(counters[a]) if a in counters else _param_index(a, params, views) for a in call.args[1 : 1 + n_args]
    )
    return Launch(str(call.args[0].value), args, grid, block, dims.get("tirx.use_dyn_shared_memory", 0))


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
    order (arrays, whose data the kernels read and write, and scalars). Each array runs inside a copy between two
    guard zones of 0xFF bytes (`Guarded`: NaN as a float, -1 as an integer), so a read past either end of it poisons
    what it feeds and a write there fails the launch, as they would fault or corrupt on a GPU; the copies are written
    back after the launches."""
    types = _kernel_params(source)
    lib = _library(_sized_dynamic_shared(source, launches), types)

    def run(*values) -> None:
        guarded = Guarded(values)
        _prefetched(lib)  # what an earlier call's failed launch left
        for launch in launches:
            cells = [
                _cell(t, i.value if isinstance(i, Counter) else guarded.values[i])
                for t, i in zip(types[launch.kernel], launch.args, strict=True)
            ]
            argv = (ctypes.c_void_p * len(cells))(*(ctypes.addressof(c) for c in cells))
            dims = (ctypes.c_uint * 6)(*launch.grid, *launch.block)
            with LAUNCHING:
                why = getattr(lib, f"emu_launch_{launch.kernel}")(argv, dims)
            if why:
                raise RuntimeError(f"{launch.kernel}: {why.decode()}")
        run.prefetches = _located(_prefetched(lib), guarded.values)  # type: ignore[attr-defined]
        guarded.write_back()

    run.prefetches = []  # type: ignore[attr-defined]
    return run


def _prefetched(lib: ctypes.CDLL) -> list[int]:
    """The addresses the launches asked L2 for (`prefetch.global.L2`) since the last call, in order."""
    n = lib.emu_prefetched(None, ctypes.c_size_t(0))
    out = (ctypes.c_uint64 * n)()
    lib.emu_prefetched(out, ctypes.c_size_t(n))
    return list(out)


def _located(addresses: list[int], values: list) -> list[tuple[int | None, int]]:
    """Each address as (the position among `values` of the array holding it, its byte offset there), or (None, the
    address) where no array holds it."""
    spans, first = _arrays(values), {}
    for i, v in enumerate(values):
        first.setdefault(id(v), i)
    located: list[tuple[int | None, int]] = []
    for at in addresses:
        holder = next(((first[k], at - lo) for k, (_, _, lo, hi) in spans.items() if lo <= at < hi), None)
        located.append(holder if holder else (None, at))
    return located


def _arrays(values) -> dict[int, tuple[object, np.ndarray, int, int]]:
    """Each array among `values` (numpy arrays, host TVM tensors) once, by id: (the array, its host view or copy,
    the address of its first byte, the address past its last)."""
    arrays = {}
    for v in values:
        if _is_array(v) and id(v) not in arrays:
            host = v if isinstance(v, np.ndarray) else v.numpy()
            arrays[id(v)] = (v, host, address(v), address(v) + host.nbytes)
    return arrays


class Guarded:
    """Copies of the host arrays among `values` (numpy arrays, TVM tensors), each between two `GUARD`-byte zones of
    0xFF; `values` with the copies in place of the arrays (an array passed twice, as a state and its alias, gets one
    copy). Arrays whose memory overlaps another's (views of one buffer) run unguarded, in place."""

    GUARD = 1 << 16

    def __init__(self, values) -> None:
        arrays = _arrays(values)
        self.copies: dict[int, tuple[object, np.ndarray, np.ndarray]] = {}  # id -> (array, padded, copy)
        for k, (v, host, lo, hi) in arrays.items():
            if any(o != k and lo < ohi and olo < hi for o, (_, _, olo, ohi) in arrays.items()):
                continue
            padded = np.full(host.nbytes + 2 * self.GUARD, 0xFF, dtype=np.uint8)
            copy = padded[self.GUARD : self.GUARD + host.nbytes].view(host.dtype).reshape(host.shape)
            copy[...] = host
            self.copies[k] = (v, padded, copy)
        self.values = [self.copies[id(v)][2] if id(v) in self.copies else v for v in values]

    def write_back(self) -> None:
        """The copies into their arrays; a guard zone written to is an error naming the array's shape."""
        for v, padded, copy in self.copies.values():
            if (padded[: self.GUARD] != 0xFF).any() or (padded[self.GUARD + copy.nbytes :] != 0xFF).any():
                raise RuntimeError(f"a kernel wrote outside an array of shape {copy.shape} ({copy.dtype})")
            if isinstance(v, np.ndarray):
                v[...] = copy
            else:
                v.copyfrom(copy)


def _is_array(value) -> bool:
    """A numpy array or a (host) TVM tensor, not a scalar."""
    return isinstance(value, np.ndarray) or hasattr(value, "numpy")


def _cell(ctype: str, value) -> ctypes._SimpleCData:
    """`value` as the kernel parameter of C type `ctype`: a pointer to the array's data, or the scalar."""
    if ctype.endswith("*"):
        return ctypes.c_void_p(address(value))
    if ctype not in SCALARS:
        raise NotEmulated(f"kernel parameter type {ctype}")
    return SCALARS[ctype](value)


def _sized_dynamic_shared(source: str, launches: list[Launch]) -> str:
    """`source` with each kernel's `extern __shared__ T name[]` (TVM's one dynamic allocation) as a `__shared__` array
    of the most bytes any launch of that kernel gives it: the shim's shared storage is static."""
    sizes: dict[str, int] = {}
    for launch in launches:
        sizes[launch.kernel] = max(sizes.get(launch.kernel, 0), launch.dynamic_shared)
    starts = [(m.start(), m.group(1)) for m in KERNEL_DEF.finditer(source)]
    pieces, end = [], len(source)
    for (start, kernel), (stop, _) in zip(starts, [*starts[1:], (end, "")], strict=True):
        body, declared = source[start:stop], DYNAMIC_SHARED.search(source[start:stop])
        if declared and not sizes.get(kernel):
            raise NotEmulated(f"{kernel}: dynamic shared memory that no launch sizes")
        if declared:
            attrs, ctype, name = declared.groups()
            array = f"__shared__ {attrs}{ctype} {name}[({sizes[kernel]} + sizeof({ctype}) - 1) / sizeof({ctype})];"
            body = body[: declared.start()] + array + body[declared.end() :]
        pieces.append(body)
    return source[: starts[0][0] if starts else end] + "".join(pieces)


def _kernel_params(source: str) -> dict[str, list[str]]:
    """Each kernel's parameter C types, from its definition in `source`."""
    kernels = {}
    for name, params in KERNEL_DEF.findall(source):
        decls = [p.replace("__restrict__", "").split() for p in params.split(",")]
        kernels[name] = [" ".join(d[:-1]).replace(" *", "*") for d in decls]
    return kernels


def _library(source: str, kernels: dict[str, list[str]]) -> ctypes.CDLL:
    """`source` with a launcher per kernel, built against the shim (cached under `CACHE` by content)."""
    source = _rewrite_asm(source)
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
            (Path(tmp) / "mma.h").write_text("#include <cuda.h>\n")  # and the inline PTX of tensor cores (no wmma)
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
    lib.emu_prefetched.restype = ctypes.c_size_t
    return lib


def _rewrite_asm(source: str) -> str:
    """`source` with each inline PTX statement that the shim models replaced by the shim's call (on the statement's
    first line, the lines after it kept where they were); any other asm raises `NotEmulated` naming it."""
    pieces, done, pos = [], 0, 0
    while found := ASM_OR_SKIPPED.search(source, pos):
        pos = found.end()
        if found.group() not in ("__asm__", "__asm", "asm"):  # a comment, literal or preprocessor line
            if found.group().lstrip().startswith("#") and ASM_CALL.search(found.group()):
                raise NotEmulated(f"inline asm in a macro: {found.group().strip()!r}")
            continue
        end, call = _asm_statement(source, found.start(), found.end())
        pieces += [source[done : found.start()], call, "\n" * source.count("\n", found.start(), end)]
        done = pos = end
    return "".join(pieces) + source[done:]


def _asm_statement(source: str, start: int, keyword_end: int) -> tuple[int, str]:
    """The end of the asm statement at `start` (`asm volatile("template" : outputs : inputs);`, its keyword ending
    at `keyword_end`) and the shim's call doing what it does."""
    head = ASM_QUALIFIERS.match(source, keyword_end)
    close = _closing(source, head.end() - 1) if head else start
    semicolon = re.compile(r"\s*;").match(source, close) if head else None
    if not head or not semicolon:
        raise NotEmulated(f"asm that is no statement: {source[start : start + 80]!r}")
    template, *sections = _split_top(source[head.end() : close - 1], ":")
    strings = LITERAL.findall(template)
    if LITERAL.sub("", template).strip() or any(not s.startswith('"') for s in strings):
        raise NotEmulated(f"asm whose template is no string: {template.strip()!r}")
    ptx = codecs.decode("".join(s[1:-1] for s in strings), "unicode_escape")
    name = re.match(r"\s*([\w.:]+)", ptx)
    if not name:
        raise NotEmulated(f"inline PTX {ptx.strip()[:80]!r}")
    if len(sections) > 2 and (len(sections) > 3 or set(LITERAL.findall(sections[2])) - {'"memory"'}):
        raise NotEmulated(f"{name[1]} with clobbers or labels {':'.join(sections[2:]).strip()!r}")
    outputs, inputs = (_operands(s) for s in [*sections, "", ""][:2])
    return semicolon.end(), _shim_call(name[1], "".join(ptx[name.end() :].split()), outputs, inputs)


def _shim_call(instruction: str, operands: str, outputs: list[tuple[str, str]], inputs: list[tuple[str, str]]) -> str:
    """The shim's call doing `instruction` with `operands` (its template's operand list, white space removed) on an
    asm statement's outputs and inputs (constraint and parenthesised C++ expression each)."""
    if instruction == "cp.async.commit_group" and (operands, outputs, inputs) == (";", [], []):
        return "emu::cp_async_commit_group();"
    if instruction == "cp.async.wait_group" and WAIT_GROUP.fullmatch(operands) and not (outputs or inputs):
        return f"emu::cp_async_wait_group({WAIT_GROUP.fullmatch(operands)[1]});"
    if instruction == "cp.async.wait_group" and (operands, outputs, [c for c, _ in inputs]) == ("%0;", [], ["n"]):
        return f"emu::cp_async_wait_group({inputs[0][1]});"  # a constant operand (a template's, in hand CUDA)
    griddep = instruction in ("griddepcontrol.wait", "griddepcontrol.launch_dependents")
    if griddep and (operands, outputs, inputs) == (";", [], []):  # launches run one after another here
        return ";"
    if instruction == "prefetch.global.L2" and (operands, outputs, [c for c, _ in inputs]) == ("[%0];", [], ["l"]):
        return f"emu::prefetch_l2({inputs[0][1]});"
    ldmatrix, cp_async = LDMATRIX.fullmatch(instruction), CP_ASYNC.fullmatch(instruction)
    if cp_async:  # [dst] (a shared-window offset), [src] (a global pointer), bytes (a constant)
        expect = "[%0],[%1],%2;", [], ["r", "l", "n"]
    elif ldmatrix:
        n = int(ldmatrix[1])
        expect = "{" + ",".join(f"%{i}" for i in range(n)) + f"}},[%{n}];", ["=r"] * n, ["r"]
    elif instruction == MMA_BF16:
        expect = "{%0,%1,%2,%3},{%4,%5,%6,%7},{%8,%9},{%10,%11,%12,%13};", ["=f"] * 4, ["r"] * 6 + ["f"] * 4
    else:
        raise NotEmulated(
            f"inline PTX {instruction!r} (the emulator models ldmatrix .m8n8 .b16, {MMA_BF16}, cp.async and "
            "prefetch.global.L2)"
        )
    got = operands, [c for c, _ in outputs], [c for c, _ in inputs]
    if got != expect:
        raise NotEmulated(f"{instruction} with operands and constraints {got}, not {expect}")
    out = ", ".join(e for _, e in outputs)  # lvalues, which the shim writes through `emu::Reg`
    bits = [f"emu::bits{e}" for _, e in inputs]
    if cp_async:
        return f"emu::cp_async({bits[0]}, {inputs[1][1]}, {inputs[2][1]});"
    if ldmatrix:
        return f"emu::ldmatrix(/*trans=*/{'true' if ldmatrix[2] else 'false'}, {bits[0]}, {{{out}}});"
    a, b, c = ", ".join(bits[:4]), ", ".join(bits[4:6]), ", ".join(bits[6:])
    return f"emu::mma_m16n8k16_bf16({{{out}}}, {{{a}}}, {{{b}}}, {{{c}}});"


def _operands(section: str) -> list[tuple[str, str]]:
    """An asm statement's outputs or inputs: `"=r"(expression), ...` as (constraint, parenthesised expression)."""
    operands = []
    for text in _split_top(section, ",") if section.strip() else []:
        operand = OPERAND.fullmatch(text)
        if not operand or _closing(operand[2], 0) != len(operand[2]):
            raise NotEmulated(f'asm operand {text.strip()!r}: not `"constraint"(expression)`')
        operands.append((operand[1], operand[2]))
    return operands


def _split_top(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` outside brackets and literals."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        if text[i] in "\"'":
            i = _literal_end(text, i)
            continue
        if text[i] == separator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        depth += (text[i] in "([{") - (text[i] in ")]}")
        i += 1
    return [*parts, text[start:]]


def _closing(text: str, opening: int) -> int:
    """The index past the bracket closing the one at `opening`, brackets in literals aside."""
    depth, i = 0, opening
    while i < len(text):
        if text[i] in "\"'":
            i = _literal_end(text, i)
            continue
        depth += (text[i] in "([{") - (text[i] in ")]}")
        i += 1
        if depth == 0:
            return i
    raise NotEmulated(f"unbalanced brackets: {text[opening : opening + 80]!r}")


def _literal_end(text: str, start: int) -> int:
    literal = LITERAL.match(text, start)
    if not literal:
        raise NotEmulated(f"an unterminated literal: {text[start : start + 80]!r}")
    return literal.end()
