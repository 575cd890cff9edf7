"""Load an exported module (`make build`) with the TVM runtime alone: no compiler, no registry.

A build folder `<build>/<naming.build(cfg, target)>/` (e.g. `build/llvm/qwen3.5-0.8b-B1-S1-L4096-sl128-grouped/`)
holds the shared library and `manifest.json`, which names every function (= registry op name), its argument
signature, where its schedule came from and the full decode config and target it was built for. `load` checks the
manifest against what the caller asks for and returns checked `Kernel`s.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import tvm

from gdn_tvm import naming
from gdn_tvm.config import DecodeConfig
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.signature import Arg

MANIFEST = "manifest.json"
FORMAT = 2
DEVICES = {"llvm": (1, 0), "cuda": (2, 0)}  # DLPack (device type, index) of each target's kernels


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
    bound = tuple(d["bound"]) if d["bound"] is not None else None
    return Arg(d["name"], tuple(d["shape"]), d["dtype"], d["role"], bound, None, d["alias"], d["slot_pool"])


def manifest_path(path: str | Path, cfg: DecodeConfig, target: str) -> Path:
    """`path` itself (a manifest), `path/manifest.json` (a build folder) or the artifact folder under `path`."""
    path = Path(path)
    for candidate in (path, path / MANIFEST, path / naming.build(cfg, target) / MANIFEST):
        if candidate.is_file():
            return candidate
    raise ManifestError(f"no {MANIFEST} for {naming.build(cfg, target)} at {path} (run `make build`)")


def read_manifest(path: str | Path, cfg: DecodeConfig, target: str) -> tuple[Path, dict]:
    """The manifest's path and content, checked to be for `cfg` (every field), `target` and this TVM version."""
    file = manifest_path(path, cfg, target)
    try:
        manifest = json.loads(file.read_text())
    except ValueError as err:
        raise ManifestError(f"{file}: not JSON: {err}") from None
    want = {"format": FORMAT, "target": target, "tvm": tvm.__version__, **_flat(dataclasses.asdict(cfg))}
    have = {k: manifest.get(k) for k in ("format", "target", "tvm")} | _flat(manifest.get("config", {}))
    wrong = {k: have.get(k) for k, v in want.items() if have.get(k) != v}
    if wrong:
        got = ", ".join(f"{k}={v!r} (wanted {want[k]!r})" for k, v in wrong.items())
        raise ManifestError(f"{file} does not match the request: {got}")
    return file, manifest


def _flat(config: dict) -> dict:
    """`{"model": {"name": ..}, "batch": ..}` -> `{"name": .., "batch": ..}` (field names are unique)."""
    return {
        k: v
        for key, value in config.items()
        for k, v in (_flat(value) if isinstance(value, dict) else {key: value}).items()
    }


def load(path: str | Path, cfg: DecodeConfig, target: str) -> dict[str, Kernel]:
    """The kernels built for `cfg` and `target`, by registry op name; `path` is a manifest, a build folder or the
    build root."""
    file, manifest = read_manifest(path, cfg, target)
    lib = tvm.runtime.load_module(str(file.parent / manifest["library"]))
    return {
        name: Kernel(name, lib[name], [arg_from_json(a) for a in fn["args"]], DEVICES[target])
        for name, fn in manifest["functions"].items()
    }
