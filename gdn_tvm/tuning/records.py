"""Tuning-log folders: validation (a corrupt or foreign log is an error naming the file), pruning to the best
record, the strict lookup `make build` applies, and the per-workload summary."""

from __future__ import annotations

import hashlib
import json
import lzma
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from gdn_tvm.tuning.workload import Workload

WORKLOADS = "database_workload.json"  # MetaSchedule's JSON database: the workload table
PACKED = WORKLOADS + ".xz"  # ... as a pruned log keeps it: serialised IRModules shrink ~20x, the repo stays small
RECORDS = "database_tuning_record.json"  # ... and the tuning records
SUMMARY = "summary.json"  # trials, best and hand-schedule microseconds of the last tuning run, CUDA compiler
SCRATCH = "scratch"  # the full database and MetaSchedule's logs while a workload is tuned


class TuningLogError(RuntimeError):
    """A tuning log that cannot be used (corrupt, foreign, not replayable); the message names the file."""


class MissingRecordError(LookupError):
    """No tuning record for a workload; the message names the workload key and where it was looked for."""


@dataclass(frozen=True)
class Found:
    """The best record of a workload, the folder it came from and a hash of the record file."""

    record: ms.database.TuningRecord
    folder: Path
    digest: str

    @property
    def run_us(self) -> float:
        return mean_us(self.record)

    @property
    def compiler(self) -> str | None:
        """The CUDA compiler and release the record was timed with (`summary.json`); None for other targets and
        for a log without a summary (copied without it, or from before summaries named it)."""
        if not (self.folder / SUMMARY).exists():
            return None
        return read_summary(self.folder).get("compiler")


def folder(root: str | Path, w: Workload) -> Path:
    """`<root>/<workload key>`."""
    return Path(root) / w.key


def has_log(path: Path) -> bool:
    return any((path / name).exists() for name in (RECORDS, WORKLOADS, PACKED))


def mean_us(record: ms.database.TuningRecord) -> float:
    secs = [float(s) for s in record.run_secs]
    return sum(secs) / len(secs) * 1e6


def open_db(path: Path, kind: str, *, create: bool = False) -> ms.database.Database:
    """The database in `path`, validated first: `TuningLogError` naming the file if a line does not parse, has
    the wrong structure, or holds a record tuned for a target kind other than `kind`. A pruned log (workload
    table packed) opens read-only, in memory; otherwise a JSON database that commits append to `path`."""
    if (path / PACKED).exists():
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / WORKLOADS).write_bytes(_unpack(path / PACKED))
            shutil.copyfile(path / RECORDS, Path(tmp) / RECORDS)
            db = _open_json(Path(tmp), kind, create=False, shown=path)
            memory = ms.database.MemoryDatabase()
            db.dump_pruned(memory)  # a pruned log holds one record per workload: nothing is lost
            return memory
    return _open_json(path, kind, create=create, shown=path)


def _open_json(path: Path, kind: str, *, create: bool, shown: Path) -> ms.database.JSONDatabase:
    if not create:
        for name in (WORKLOADS, RECORDS):
            if not (path / name).exists():
                raise TuningLogError(f"{shown / name}: missing (a tuning log needs {WORKLOADS} and {RECORDS})")
    n_workloads = _check_lines(path / WORKLOADS, _check_workload_line, shown / _packed_name(shown))
    _check_lines(path / RECORDS, lambda line: _check_record_line(line, n_workloads, kind), shown / RECORDS)
    try:
        return ms.database.JSONDatabase(work_dir=str(path), allow_missing=create)
    except Exception as err:  # TVM's loader reports C++ errors; name the files
        raise TuningLogError(f"{shown / WORKLOADS} / {RECORDS}: MetaSchedule cannot load them: {err}") from err


def _packed_name(path: Path) -> str:
    return PACKED if (path / PACKED).exists() else WORKLOADS


def _unpack(path: Path) -> bytes:
    try:
        return lzma.decompress(path.read_bytes())
    except lzma.LZMAError as err:
        raise TuningLogError(f"{path}: not an xz file: {err}") from None


def _check_lines(path: Path, check, shown: Path) -> int:
    if not path.exists():
        return 0
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    for i, line in enumerate(lines, 1):
        try:
            check(json.loads(line))
        except (ValueError, TypeError, KeyError, IndexError) as err:
            raise TuningLogError(f"{shown}: line {i} is not a MetaSchedule record: {err}") from None
    return len(lines)


def _check_workload_line(line) -> None:
    if not (isinstance(line, list) and len(line) == 2 and all(isinstance(x, str) for x in line)):
        raise ValueError("expected [structural hash, serialised IRModule]")


def _check_record_line(line, n_workloads: int, kind: str) -> None:
    index, (trace, run_secs, target, _args) = line
    if not (isinstance(index, int) and 0 <= index < n_workloads):
        raise ValueError(f"workload index {index!r} outside the {n_workloads} workloads of {WORKLOADS}")
    if not (isinstance(trace, list) and isinstance(run_secs, list) and isinstance(target, dict)):
        raise ValueError("expected [trace, run_secs, target, args]")
    if target.get("kind") != kind:
        raise ValueError(f"foreign log: tuned for target {target.get('kind')!r}, this folder is for {kind!r}")


def best(db: ms.database.Database, w: Workload) -> ms.database.TuningRecord | None:
    """The fastest record of `w` in `db` (matched by workload only), or None."""
    if not db.has_workload(w.mod):
        return None
    top = db.get_top_k(db.commit_workload(w.mod), 1)
    return top[0] if top else None


def lookup(root: str | Path, w: Workload) -> Found:
    """The best record of `w` under `root`: `MissingRecordError` without one, `TuningLogError` for a bad log."""
    path = folder(root, w)
    if not has_log(path):
        raise MissingRecordError(f"no tuning record for workload {w.key} (op {w.op.name}): no log in {path}")
    record = best(open_db(path, w.kind), w)
    if record is None:
        raise MissingRecordError(
            f"no tuning record for workload {w.key} (op {w.op.name}): {path / _packed_name(path)} holds another "
            "definition (the op changed since it was tuned; re-tune it with --force)"
        )
    return Found(record, path, hashlib.sha256((path / RECORDS).read_bytes()).hexdigest()[:16])


def replay(record: ms.database.TuningRecord, w: Workload, log: Path) -> s_tir.Schedule:
    """`record`'s trace (from the log folder `log`) replayed on the general function."""
    # `Op.definition` names it "main" already. Not `with_attr` here: a schedule over a fresh PrimFunc that shares
    # its body with `w.general` rewrites that body in place, and with it the workload tuning records refer to.
    sch = s_tir.Schedule(w.general)
    try:
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except Exception as err:  # a schedule error of any primitive in the trace
        raise TuningLogError(f"{log / RECORDS}: the trace does not replay on {w.op.name}: {err}") from err
    return sch


def prune(path: Path, kind: str, record: ms.database.TuningRecord) -> None:
    """Replace the log in `path` by `record`, its workload table packed."""
    drop(path)
    out = _open_json(path, kind, create=True, shown=path)
    out.commit_tuning_record(
        ms.database.TuningRecord(
            record.trace, out.commit_workload(record.workload.mod), record.run_secs, record.target, record.args_info
        )
    )
    (path / PACKED).write_bytes(lzma.compress((path / WORKLOADS).read_bytes(), preset=9))
    (path / WORKLOADS).unlink()


def drop(path: Path) -> None:
    """Delete the pruned log in `path` (records, workload table, summary); a scratch database stays."""
    for name in (WORKLOADS, RECORDS, PACKED, SUMMARY):
        (path / name).unlink(missing_ok=True)


def seed_scratch(path: Path) -> None:
    """Start a scratch database from the pruned log (so a forced re-tune keeps the best of old and new)."""
    scratch = path / SCRATCH
    scratch.mkdir(parents=True, exist_ok=True)
    if (path / PACKED).exists() and not (scratch / WORKLOADS).exists():
        (scratch / WORKLOADS).write_bytes(_unpack(path / PACKED))
    for name in (WORKLOADS, RECORDS):
        if (path / name).exists() and not (scratch / name).exists():
            shutil.copyfile(path / name, scratch / name)


def write_summary(path: Path, summary: dict) -> None:
    (path / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")


def read_summary(path: Path) -> dict:
    try:
        return json.loads((path / SUMMARY).read_text())
    except (OSError, ValueError) as err:
        raise TuningLogError(f"{path / SUMMARY}: unreadable ({err}); re-tune the workload with --force") from None
