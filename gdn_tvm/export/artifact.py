"""`make build`: apply the tuning records strictly, compile every registry op for one target into one shared
library, and write `manifest.json` beside it (`<out>/<naming.build(cfg, target)>/`).

A workload without a record is an error naming it, unless `allow_hand`: then its hand schedule is built, and
the manifest and the summary count it. Ops sharing a workload (same shapes) share its schedule. `dlight=True`
builds TVM's dlight default schedules instead (the benchmarks' untuned baseline), leaving out the ops no dlight
rule fits. An op that is a library call on the target (`Op.library`: the batched steps' cuBLAS GEMMs on CUDA) is not
compiled: the manifest lists it with its signature and library, and `load` makes its function from that library.

A build is written into a temporary folder beside its destination (`.<name>.partial-<random>`, same parent) and
renamed into place at the end, replacing an earlier build of that name only then: an interrupted build leaves no
half-written folder under the final name. `load` never looks at temporary folders; the next build of the name
removes those left over. The manifest records the library's size and SHA-256 and a digest of what `load` reads
(`runtime.module.digest`), so that `load` refuses a truncated or altered library and an edited manifest.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tvm
from tvm import tirx

from gdn_tvm import naming
from gdn_tvm.codegen import cuda_stub
from gdn_tvm.codegen.compile import dlight_schedule, ptxas_flags
from gdn_tvm.codegen.library import cuda_compiler, export_library
from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import step_ops
from gdn_tvm.registry import get, workload_groups
from gdn_tvm.runtime.module import FORMAT, MANIFEST, arg_to_json, digest, file_sha256
from gdn_tvm.tuning import records
from gdn_tvm.tuning.workload import Workload, workload


@dataclass(frozen=True)
class Scheduled:
    """One op's scheduled PrimFunc; `source` is "tuned" (from a record file with hash `digest`) or "hand"."""

    name: str
    key: str
    func: tirx.PrimFunc
    source: str
    digest: str | None
    tuned_us: float | None  # the record's measured time
    tuned_with: str | None = None  # the CUDA compiler that timed the record


def schedule_ops(
    cfg: DecodeConfig, kind: str, logs: str | Path, names: Sequence[str], allow_hand: bool
) -> list[Scheduled]:
    """Every op of `names` scheduled from its tuning record (hand schedule only with `allow_hand`); library calls on
    `kind` (`Op.compiled`) are left out.

    Raises `MissingRecordError` naming every workload without a record when not `allow_hand`.
    """
    by_name: dict[str, Scheduled] = {}
    missing: list[str] = []
    for group in workload_groups(cfg, kind, names).values():
        scheduled = _schedule(workload(get(group[0]), cfg, kind), logs, allow_hand, missing)
        if scheduled is not None:
            by_name.update({name: dataclasses.replace(scheduled, name=name) for name in group})
    if missing and not allow_hand:
        raise records.MissingRecordError(
            f"{len(missing)} workload(s) without a tuning record (tune them, or pass --allow-hand to build "
            "their hand schedules):\n  " + "\n  ".join(missing)
        )
    return [by_name[name] for name in names if get(name).compiled(kind)]


def dlight_ops(cfg: DecodeConfig, target: tvm.target.Target, names: Sequence[str]) -> list[Scheduled]:
    """The ops of `names` that a dlight rule schedules, each with its dlight schedule."""
    scheduled = []
    for name in names:
        op = get(name)
        try:
            func = dlight_schedule(op, cfg, target)
        except (ValueError, tvm.s_tir.ScheduleError):
            continue
        scheduled.append(Scheduled(name, op.workload_key(cfg, target.kind.name), func, "dlight", None, None))
    return scheduled


def _schedule(w: Workload, logs: str | Path, allow_hand: bool, missing: list[str]) -> Scheduled | None:
    """`w` scheduled by its record, else (appending to `missing`) by hand with `allow_hand`, else None."""
    try:
        found = records.lookup(logs, w)
    except records.MissingRecordError as err:
        missing.append(str(err))
        if not allow_hand:
            return None
        return Scheduled(w.op.name, w.key, w.op.schedule(w.cfg, w.kind).mod["main"], "hand", None, None)
    func = records.replay(found.record, w, found.folder).mod["main"]
    return Scheduled(w.op.name, w.key, func, "tuned", found.digest, found.run_us, found.compiler)


def build(
    cfg: DecodeConfig,
    target: tvm.target.Target,
    logs: str | Path,
    out: str | Path,
    allow_hand: bool = False,
    names: Sequence[str] | None = None,
    echo: Callable[[str], None] = print,
    dlight: bool = False,
) -> Path:
    """Build and export every op of `names` (default: the ops a step launches, `plan.step_ops`; with `dlight`: those
    dlight schedules); returns the manifest's path."""
    kind = target.kind.name
    names = step_ops(cfg) if names is None else names
    libraries = [] if dlight else [name for name in names if not get(name).compiled(kind)]
    names = [name for name in names if name not in libraries]
    if not names:
        raise ValueError(f"nothing to compile for {kind}: {', '.join(libraries)} are library calls there")
    scheduled = dlight_ops(cfg, target, names) if dlight else schedule_ops(cfg, kind, logs, names, allow_hand)
    final = Path(out) / naming.build(cfg, kind)
    for path in (final.parent, final):  # the build replaces `final`'s folder, never a file or a link
        if (path.exists() and not path.is_dir()) or (path == final and path.is_symlink()):
            raise NotADirectoryError(f"{path}: a {'link' if path.is_symlink() else 'file'} where a build folder goes")
    final.parent.mkdir(parents=True, exist_ok=True)
    for leftover in final.parent.glob(f".{final.name}.partial-*"):  # of interrupted builds
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    folder = final.with_name(f".{final.name}.partial-{uuid.uuid4().hex[:8]}")
    folder.mkdir()
    try:
        manifest = _export(cfg, target, scheduled, libraries, folder / f"{final.name}.so", Path(out) / "cuda_stub")
        _move_into_place(folder, final)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    library = final / manifest["library"]
    hand = manifest["hand_schedules"]
    fallback = f" ({', '.join(hand)})" if hand else ""
    counts = {k: sum(s.source == k for s in scheduled) for k in ("tuned", "hand", "dlight")}
    sources = ", ".join(f"{n} {k}" for k, n in counts.items() if n or k != "dlight")
    calls = f", {len(libraries)} library calls" if libraries else ""
    echo(f"{library}: {len(scheduled)} ops, {sources}{fallback}{calls}")
    compiler = manifest.get("cuda_compile")
    other = [f"{s.name} ({s.tuned_with})" for s in scheduled if s.tuned_with not in (None, compiler)]
    if other:
        echo(
            f"warning: {len(other)} op(s) were tuned with another compiler than this build's {compiler}: "
            f"{', '.join(other)}; their records were ranked on other machine code (re-tune them with this compiler)"
        )
    return final / MANIFEST


def _export(
    cfg: DecodeConfig,
    target: tvm.target.Target,
    scheduled: list[Scheduled],
    libraries: list[str],
    library: Path,
    stub: Path,
) -> dict:
    """Compile `scheduled` into `library` and write the manifest beside it, listing the ops of `libraries` as the
    library calls they are on the target (`Op.library`); returns the manifest."""
    kind = target.kind.name
    mod = tvm.IRModule({s.name: s.func.with_attr("global_symbol", s.name) for s in scheduled})
    manifest: dict = {
        "format": FORMAT,
        "key": naming.build(cfg, kind),
        "target": kind,
        "tvm": tvm.__version__,
        "library": library.name,
        "config": dataclasses.asdict(cfg),
        "target_json": json.loads(str(target)),  # str(Target) is its JSON
    }
    if kind == "cuda" and not tvm.runtime.enabled("cuda"):
        manifest["cuda_compile"] = cuda_compiler(cuda_stub.export_with_stub(mod, target, library, stub))
    else:
        export_library(mod, target, library)
        if kind == "cuda":
            manifest["cuda_compile"] = cuda_compiler()
    manifest["library_bytes"] = library.stat().st_size
    manifest["library_sha256"] = file_sha256(library)
    manifest["hand_schedules"] = [s.name for s in scheduled if s.source == "hand"]
    manifest["functions"] = {
        s.name: {
            "workload": s.key,
            "schedule": s.source,
            "record": s.digest,
            "tuned_us": s.tuned_us,
            "tuned_with": s.tuned_with,
            **({"ptxas_flags": list(ptxas_flags(tvm.IRModule({"main": s.func})))} if kind == "cuda" else {}),
            "args": [arg_to_json(a) for a in get(s.name).signature(cfg)],
        }
        for s in scheduled
    } | {
        name: {"library": get(name).library, "args": [arg_to_json(a) for a in get(name).signature(cfg)]}
        for name in libraries
    }
    manifest["digest"] = digest(manifest)
    (library.parent / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _move_into_place(folder: Path, final: Path) -> None:
    """Rename `folder` to `final`; an existing `final` is renamed aside first (to a name the next build removes)
    and deleted after."""
    if not final.exists():
        folder.rename(final)
        return
    aside = folder.with_name(f"{folder.name}-old")
    final.rename(aside)
    folder.rename(final)
    shutil.rmtree(aside)
