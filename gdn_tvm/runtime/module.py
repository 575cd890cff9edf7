"""Load an exported module (`make build`) with the TVM runtime alone: no compiler, no registry.

A build folder `<build>/<naming.build(cfg, target)>/` (e.g. `build/llvm/qwen3.5-0.8b-B1-S1-L4096-sl128-grouped/`)
holds the shared library and `manifest.json`, which names every function (= registry op name), its argument
signature, where its schedule came from and the full decode config and target it was built for. `load` checks the
manifest against what the caller asks for and returns checked `Kernel`s.

Everything wrong with a build is a `ManifestError` naming the file (and the field), raised before the library
reaches `tvm.runtime.load_module`, which can kill the process (SIGBUS) on a truncated `.so`:
- `read_manifest`: a JSON object of this `FORMAT` whose fields `load` reads are well-formed (`check_fields`), for
  the requested target, TVM version and every decode config field, and whose `digest` matches. The digest is a
  SHA-256 over exactly what `load` reads (the `READ` fields, of each function only its `args`), written at build:
  the runtime cannot ask the registry what a signature should be, so an edited shape, bound, dtype or function list
  is refused as "edited or corrupt". Fields `load` does not read are provenance (the key, the target's JSON, each
  function's workload, schedule, record, tuned time and compiler, and on CUDA the ptxas flags it was compiled with
  beyond the defaults): editing them changes nothing that loads.
- `check_library`: the library is a file of the build folder with the recorded size and SHA-256.
- `load`: every function the manifest lists is in the library.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path

import tvm

from gdn_tvm import naming
from gdn_tvm.config import DecodeConfig
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.signature import ROLES, Arg

MANIFEST = "manifest.json"
FORMAT = 5  # 5: a function may be a library call (`library`) rather than a function of the shared library
LIBRARIES = ("cublas",)  # what a manifest function's `library` may name (`runtime.cublas`)
DEVICES = {"llvm": (1, 0), "cuda": (2, 0)}  # DLPack (device type, index) of each target's kernels
READ = ("format", "target", "tvm", "config", "library", "library_bytes", "library_sha256", "functions")
CUDA_LOADER = "ffi.Module.load_from_bytes.cuda"  # registered by the tvm package's lib/libtvm_runtime_cuda.so


class ManifestError(ValueError):
    """A build does not match what was asked for (decode config, target, TVM version) or is unreadable."""


def arg_to_json(arg: Arg) -> dict:
    """An `Arg` as manifest JSON (its sampler is a test helper and is not kept)."""
    return {
        "name": arg.name,
        "shape": list(arg.shape),
        "dtype": arg.dtype,
        "role": arg.role,
        "bound": list(arg.bound) if arg.bound else None,
        "alias": arg.alias,
        "slot_pool": arg.slot_pool,
    }


def arg_from_json(d: dict) -> Arg:
    """An `Arg` from manifest JSON that `check_fields` accepted."""
    bound = tuple(d["bound"]) if d["bound"] is not None else None
    return Arg(d["name"], tuple(d["shape"]), d["dtype"], d["role"], bound, None, d["alias"], d["slot_pool"])


def digest(manifest: dict) -> str:
    """SHA-256 of what `load` reads of a manifest: the `READ` fields, of each function only its args and library."""
    functions = {n: [f["args"], f.get("library")] for n, f in manifest["functions"].items()}
    content = {k: manifest[k] for k in READ} | {"functions": functions}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifest_path(path: str | Path, cfg: DecodeConfig, target: str) -> Path:
    """`path` itself (a manifest), `path/manifest.json` (a build folder) or the artifact folder under `path`."""
    path = Path(path)
    for candidate in (path, path / MANIFEST, path / naming.build(cfg, target) / MANIFEST):
        try:
            if candidate.is_file():
                return candidate
        except OSError as err:  # a folder on the way that cannot be searched
            raise ManifestError(f"{candidate}: unreadable: {err}") from None
    raise ManifestError(f"no {MANIFEST} for {naming.build(cfg, target)} at {path} (run `make build`)")


def read_manifest(path: str | Path, cfg: DecodeConfig, target: str) -> tuple[Path, dict]:
    """The manifest's path and content: well-formed, for `cfg` (every field), `target` and this TVM version, and
    unedited (its digest)."""
    file = manifest_path(path, cfg, target)
    try:
        manifest = json.loads(file.read_text())
    except OSError as err:
        raise ManifestError(f"{file}: unreadable: {err}") from None
    except (ValueError, RecursionError) as err:  # RecursionError: nested deeper than the JSON reader goes
        raise ManifestError(f"{file}: not JSON: {err}") from None
    check_fields(file, manifest)
    want = {"target": target, "tvm": tvm.__version__, **_flat(dataclasses.asdict(cfg))}
    try:  # the JSON reader takes nesting deeper than flattening and the digest do
        have = {k: manifest.get(k) for k in ("target", "tvm")} | _flat(manifest["config"])
        wrong = {k: have.get(k) for k, v in want.items() if have.get(k) != v}
        edited = not wrong and manifest["digest"] != digest(manifest)
    except RecursionError:
        raise ManifestError(f"{file}: config: nested deeper than a build's config is") from None
    if wrong:
        got = ", ".join(f"{k}={repr(v)[:80]} (wanted {want[k]!r})" for k, v in wrong.items())
        raise ManifestError(f"{file} does not match the request: {got}")
    if edited:
        raise ManifestError(f"{file}: edited or corrupt: its digest does not match its content (run `make build`)")
    return file, manifest


def _flat(config: dict) -> dict:
    """`{"model": {"name": ..}, "batch": ..}` -> `{"name": .., "batch": ..}` (field names are unique)."""
    return {
        k: v
        for key, value in config.items()
        for k, v in (_flat(value) if isinstance(value, dict) else {key: value}).items()
    }


MISSING = object()
DTYPE = re.compile(r"bool|u?int(8|16|32|64)|float(16|32|64)|bfloat16")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_sha256(v: object) -> bool:
    return isinstance(v, str) and re.fullmatch("[0-9a-f]{64}", v) is not None


def _is_file_name(v: object) -> bool:
    """A plain file name: no path that could leave the build folder."""
    return isinstance(v, str) and v not in ("", ".", "..") and "/" not in v and "\0" not in v


def _is_bound(v: object) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(map(_is_int, v)) and v[0] < v[1]


# The fields `load` reads, each with what it must be, in words and as a test.
FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "library": ("a file name in the build folder", _is_file_name),
    "library_bytes": ("a byte count", _is_count),
    "library_sha256": ("a SHA-256 in hex", _is_sha256),
    "digest": ("a SHA-256 in hex", _is_sha256),
    "config": ("an object", lambda v: isinstance(v, dict)),
    "functions": ("a non-empty object", lambda v: isinstance(v, dict) and len(v) > 0),
}
ARG_FIELDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "name": ("a non-empty string", lambda v: isinstance(v, str) and v != ""),
    "shape": ("a list of ints >= 0", lambda v: isinstance(v, list) and all(map(_is_count, v))),
    "dtype": ("a dtype such as float32", lambda v: isinstance(v, str) and DTYPE.fullmatch(v) is not None),
    "role": (f"one of {', '.join(ROLES)}", lambda v: v in ROLES),
    "bound": ("null or [lo, hi] ints with lo < hi", lambda v: v is None or _is_bound(v)),
    "alias": ("null or an argument name", lambda v: v is None or isinstance(v, str)),
    "slot_pool": ("true or false", lambda v: isinstance(v, bool)),
}


def _error(file: Path, field: str, wanted: str, value: object) -> ManifestError:
    got = "nothing" if value is MISSING else repr(value)[:80]
    return ManifestError(f"{file}: {field}: expected {wanted}, got {got}")


def _expect(ok: bool, file: Path, field: str, wanted: str, value: object) -> None:
    """Raise `ManifestError` naming `file` and `field` unless `ok`."""
    if not ok:
        raise _error(file, field, wanted, value)


def check_fields(file: Path, manifest: object) -> None:
    """Raise `ManifestError` naming `file` and the first field `load` reads that is missing or malformed."""
    if not isinstance(manifest, dict):
        raise _error(file, "manifest", "a JSON object", manifest)
    got = manifest.get("format", MISSING)
    _expect(got == FORMAT, file, "format", f"{FORMAT} (rebuild it: `make build`)", got)
    for key, (wanted, ok) in FIELDS.items():
        _expect(ok(manifest.get(key, MISSING)), file, key, wanted, manifest.get(key, MISSING))
    for name, fn in manifest["functions"].items():
        where = f"functions.{name}"
        if not isinstance(fn, dict):
            raise _error(file, where, "an object", fn)
        library = fn.get("library")
        _expect(
            library is None or library in LIBRARIES, file, f"{where}.library", f"absent or one of {LIBRARIES}", library
        )
        args = fn.get("args", MISSING)
        if not isinstance(args, list):
            raise _error(file, f"{where}.args", "a list", args)
        for i, arg in enumerate(args):
            _check_arg(file, f"{where}.args[{i}]", arg)
        names = [a["name"] for a in args]
        _expect(len(set(names)) == len(names), file, f"{where}.args", "distinct names", names)
        states = {a["name"] for a in args if a["alias"] is None}
        for i, arg in enumerate(args):
            alias = arg["alias"]
            _expect(alias is None or alias in states, file, f"{where}.args[{i}].alias", "an argument name", alias)


def _check_arg(file: Path, where: str, arg: object) -> None:
    if not isinstance(arg, dict):
        raise _error(file, where, "an object", arg)
    unknown = sorted(set(arg) - set(ARG_FIELDS))
    _expect(not unknown, file, where, f"only the fields {', '.join(ARG_FIELDS)}", unknown)
    for key, (wanted, ok) in ARG_FIELDS.items():
        _expect(ok(arg.get(key, MISSING)), file, f"{where}.{key}", wanted, arg.get(key, MISSING))
    index = arg["role"] == "index"
    _expect(not index or arg["bound"] is not None, file, f"{where}.bound", "[lo, hi] for an index", None)


def check_library(file: Path, manifest: dict) -> Path:
    """The library of a checked manifest, after checking its size and SHA-256 against the manifest's."""
    library = file.parent / manifest["library"]
    if not library.is_file():
        raise ManifestError(f"{library}: missing (named by {file}; run `make build`)")
    try:
        size, sha256 = library.stat().st_size, file_sha256(library)
    except OSError as err:
        raise ManifestError(f"{library}: unreadable: {err}") from None
    if size != manifest["library_bytes"]:
        raise ManifestError(
            f"{library}: {size} bytes, {file} records {manifest['library_bytes']}: truncated or replaced "
            "(an interrupted copy?); run `make build`"
        )
    if sha256 != manifest["library_sha256"]:
        raise ManifestError(f"{library}: its SHA-256 is not the one {file} records: altered; run `make build`")
    return library


def load_cuda_runtime(library: Path) -> None:
    """Register TVM's CUDA module loader where it is missing: runtime-only TVM (`TVM_USE_RUNTIME_LIB=1`) does not
    load `libtvm_runtime_cuda.so`, and without it a CUDA build fails to load ("a loader of that name is not
    registered"). `library` (what is being loaded) only names the `ManifestError` raised when TVM's CUDA runtime
    cannot be loaded."""
    if tvm.get_global_func(CUDA_LOADER, allow_missing=True) is not None:
        return
    cuda = Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"
    try:
        ctypes.CDLL(str(cuda), mode=ctypes.RTLD_GLOBAL)
    except OSError as err:
        raise ManifestError(f"{library}: a CUDA build, but TVM's CUDA runtime could not be loaded: {err}") from None


def load(path: str | Path, cfg: DecodeConfig, target: str) -> dict[str, Kernel]:
    """The kernels built for `cfg` and `target`, by registry op name; `path` is a manifest, a build folder or the
    build root."""
    file, manifest = read_manifest(path, cfg, target)
    library = check_library(file, manifest)
    if target == "cuda":
        load_cuda_runtime(library)
    try:
        lib = tvm.runtime.load_module(str(library))
    except (RuntimeError, OSError) as err:  # intact, yet not loadable here (another C library, another machine)
        raise ManifestError(f"{library}: cannot be loaded here: {str(err).strip()[-300:]}") from None
    functions = manifest["functions"]
    lacking = [
        name for name, fn in functions.items() if fn.get("library") is None and not lib.implements_function(name)
    ]
    if lacking:
        raise ManifestError(f"{library}: lacks function(s) {', '.join(lacking)} that {file} lists")
    kernels = {}
    for name, fn in functions.items():
        signature = [arg_from_json(a) for a in fn["args"]]
        func = lib[name] if fn.get("library") is None else _library_function(file, target, name, signature)
        kernels[name] = Kernel(name, func, signature, DEVICES[target])
    return kernels


def _library_function(file: Path, target: str, name: str, signature: list[Arg]) -> Callable:
    """The function of library op `name` (a cuBLAS GEMM: `runtime.cublas`) on `target`'s device."""
    if target != "cuda":
        raise ManifestError(f"{file}: functions.{name} is a library call, which only CUDA builds make")
    from gdn_tvm.runtime import cublas

    try:
        return cublas.gemm_kernel(signature, DEVICES[target])
    except cublas.CublasError as err:
        raise ManifestError(f"{file}: functions.{name}: {err}") from None
