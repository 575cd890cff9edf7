"""Load an exported module (`make build`) with the TVM runtime alone: no compiler, no registry.

A build folder `<build>/<preset>-<target>-b<batch>/` holds the shared library and `manifest.json`, which names
every function (= registry op name), its argument signature, where its schedule came from and what it was built
for. `load` checks the manifest against what the caller asks for and returns checked `Kernel`s.
"""

from __future__ import annotations

import json
from pathlib import Path

import tvm

from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.signature import Arg

MANIFEST = "manifest.json"
FORMAT = 1
DEVICES = {"llvm": (1, 0), "cuda": (2, 0)}  # DLPack (device type, index) of each target's kernels


class ManifestError(ValueError):
    """A build does not match what was asked for (preset, target, batch, TVM version) or is unreadable."""


def artifact_name(preset: str, target: str, batch: int) -> str:
    """The build folder of one preset, target kind and batch: `<preset>-<target>-b<batch>`."""
    return f"{preset}-{target}-b{batch}"


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
    bound = tuple(d["bound"]) if d["bound"] is not None else None
    return Arg(d["name"], tuple(d["shape"]), d["dtype"], d["role"], bound, None, d["alias"], d["slot_pool"])


def manifest_path(path: str | Path, preset: str, target: str, batch: int) -> Path:
    """`path` itself (a manifest), `path/manifest.json` (a build folder) or the artifact folder under `path`."""
    path = Path(path)
    for candidate in (path, path / MANIFEST, path / artifact_name(preset, target, batch) / MANIFEST):
        if candidate.is_file():
            return candidate
    raise ManifestError(f"no {MANIFEST} for {artifact_name(preset, target, batch)} at {path} (run `make build`)")


def read_manifest(path: str | Path, preset: str, target: str, batch: int) -> tuple[Path, dict]:
    """The manifest's path and content, checked to be for `preset`, `target`, `batch` and this TVM version."""
    file = manifest_path(path, preset, target, batch)
    try:
        manifest = json.loads(file.read_text())
    except ValueError as err:
        raise ManifestError(f"{file}: not JSON: {err}") from None
    want = {"format": FORMAT, "preset": preset, "target": target, "batch": batch, "tvm": tvm.__version__}
    wrong = {k: manifest.get(k) for k, v in want.items() if manifest.get(k) != v}
    if wrong:
        got = ", ".join(f"{k}={v!r} (wanted {want[k]!r})" for k, v in wrong.items())
        raise ManifestError(f"{file} does not match the request: {got}")
    return file, manifest


def load(path: str | Path, preset: str, target: str, batch: int) -> dict[str, Kernel]:
    """The built kernels by registry op name; `path` is a manifest, a build folder or the build root."""
    file, manifest = read_manifest(path, preset, target, batch)
    lib = tvm.runtime.load_module(str(file.parent / manifest["library"]))
    return {
        name: Kernel(name, lib[name], [arg_from_json(a) for a in fn["args"]], DEVICES[target])
        for name, fn in manifest["functions"].items()
    }
