"""Tuning-log folders: validation (a corrupt or foreign log is an error naming the file, and the line or field where
that helps), pruning to the best record, the strict lookup `make build` applies, and the per-workload summary.

A pruned log holds its record as MetaSchedule writes it and, in place of MetaSchedule's workload table, the structural
hash of the workload it was tuned for: the IRModule is the op's definition (`Workload.mod`), rebuilt from the code,
and a log whose hash is not that module's is of another definition. While a workload is tuned, its scratch database
is MetaSchedule's JSON database, workload table included.

A log is checked in Python before TVM reads it, for the structure MetaSchedule writes: TVM's readers trust their
input (a trace decision's index is written to unchecked, a null where they expect an object is dereferenced, an
IRModule graph's node indices are followed without a cycle check, a length prefix is allocated as given), so a
corrupt line could crash the process rather than raise. tests/test_records_fuzz.py holds these checks to account."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import lzma
import math
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm_ffi import core as ffi_core

from gdn_tvm.tuning.workload import Workload

WORKLOADS = "database_workload.json"  # MetaSchedule's JSON database (a scratch database): the workload table
RECORDS = "database_tuning_record.json"  # ... and the tuning records
PACKED_RECORDS = RECORDS + ".xz"  # ... as a pruned log keeps them (a trace shrinks ~4x)
HASH = "workload_hash.json"  # a pruned log's workload: {"structural_hash": <the hash of Workload.mod>}
HASH_FIELD = "structural_hash"
FORCE_HINT = "python -m gdn_tvm.tuning --force tunes the workload afresh, replacing its log"
SUMMARY = "summary.json"  # trials, best and hand-schedule microseconds of the last tuning run, CUDA compiler
SCRATCH = "scratch"  # the full database and MetaSchedule's logs while a workload is tuned
# summary.json's fields and their types, as the tuner writes them ("compiler" for CUDA only). They report the last
# tuning run and are not checked against the record; fields not listed here are ignored.
SUMMARY_FIELDS = {"ops": list, "trials": int, "best_us": float, "hand_us": float, "hand_designs": str, "timing": str}
SUMMARY_FIELDS |= {"note": str, "compiler": str}
MAX_SECS = 1e10  # the run time MetaSchedule records for a candidate that failed, the longest it writes


class TuningLogError(RuntimeError):
    """A tuning log that cannot be used (corrupt, foreign, not replayable); the message names the file."""


class MissingRecordError(LookupError):
    """No tuning record for a workload; the message names the workload key and where it was looked for."""


@dataclass(frozen=True)
class Found:
    """The best record of a workload, the folder it came from, a hash of the record file, and the CUDA compiler and
    release the record was timed with (`summary.json`; None for other targets and for a log without a summary)."""

    record: ms.database.TuningRecord
    folder: Path
    digest: str
    compiler: str | None

    @property
    def run_us(self) -> float:
        return mean_us(self.record)


def folder(root: str | Path, w: Workload) -> Path:
    """`<root>/<workload key>`."""
    return Path(root) / w.key


def has_log(path: Path) -> bool:
    """Whether `path` holds a pruned log, or part of one (a record file or the workload hash)."""
    return any((path / name).exists() for name in (RECORDS, PACKED_RECORDS, HASH))


def record_file(path: Path) -> Path:
    """The record file of the log folder `path`: packed (`.xz`) where that exists, else as MetaSchedule writes it."""
    packed = path / PACKED_RECORDS
    return packed if packed.exists() else path / RECORDS


def structural_hash(w: Workload) -> int:
    """The hash of `w.mod` that a pruned log stores; MetaSchedule's database matches workloads by it too. It is
    tvm_ffi's, pinned with TVM: a release that hashed otherwise would read every log as of another definition."""
    return tvm_ffi.structural_hash(w.mod)


def mean_us(record: ms.database.TuningRecord) -> float:
    secs = [float(s) for s in record.run_secs]
    return sum(secs) / len(secs) * 1e6


def open_db(path: Path, w: Workload) -> ms.database.MemoryDatabase:
    """The pruned log of `w` in `path` as a read-only database, checked first: `TuningLogError` naming the file (and
    line or field) if a file is missing, unreadable or empty, the hash file is not `{"structural_hash": <int>}`, a
    record line is not what MetaSchedule writes or was tuned for a target kind other than `w.kind`, or TVM cannot
    load it. The database holds `w.mod` and the log's records if the log's hash is `w.mod`'s, else nothing (a log
    of another definition of the op)."""
    for file in (path / HASH, record_file(path)):
        if not file.exists():
            raise TuningLogError(f"{file}: missing (a tuning log holds {HASH} and {RECORDS}, that may be .xz)")
    shash = _read_hash(path / HASH)
    lines = _check_lines(record_file(path), lambda line: _check_record_line(line, 1, w.kind))
    if not lines:
        raise TuningLogError(f"{record_file(path)}: empty (a tuning log holds a record)")
    return _load(path, w, lines) if shash == structural_hash(w) else ms.database.MemoryDatabase()


def open_scratch(path: Path, kind: str) -> ms.database.JSONDatabase:
    """The scratch database in `path`: MetaSchedule's JSON database, created if missing, that commits append to;
    checked first: `TuningLogError` naming the file and line if a line is not what MetaSchedule writes or a record
    was tuned for a target kind other than `kind`, or naming `path` if TVM cannot load the database."""
    workloads = _check_lines(path / WORKLOADS, _check_workload_line)
    _check_lines(path / RECORDS, lambda line: _check_record_line(line, len(workloads), kind))
    try:
        return ms.database.JSONDatabase(work_dir=str(path), allow_missing=True)
    except Exception as err:  # TVM raises its C++ errors as Python exceptions of several types
        raise TuningLogError(f"{path}: MetaSchedule cannot load the database: {_reason(err)}") from err


def _read_hash(file: Path) -> int:
    """The structural hash in the hash file `file`; `TuningLogError` naming it if it is not `{HASH_FIELD: <int>}`."""
    try:
        value = _parse(_read(file))
        _require(
            isinstance(value, dict) and value.keys() == {HASH_FIELD} and _is_index(value[HASH_FIELD], 2**64),
            f'expected {{"{HASH_FIELD}": <an integer in [0, 2**64)>}}',
        )
    except (ValueError, RecursionError) as err:
        raise TuningLogError(f"{file}: unreadable ({err})") from None
    return value[HASH_FIELD]


def _load(path: Path, w: Workload, records: list) -> ms.database.MemoryDatabase:
    """`w.mod` and the checked record lines of the log in `path`, loaded by TVM one at a time into a read-only
    database; `TuningLogError` naming the line TVM rejects (a trace that does not replay, a target TVM refuses)."""
    db = ms.database.MemoryDatabase()
    workload = db.commit_workload(w.mod)
    for i, (_, record) in enumerate(records, 1):
        with _named(record_file(path), i, "MetaSchedule cannot load the record"):
            db.commit_tuning_record(ms.database.TuningRecord.from_json(record, workload))
    return db


@contextlib.contextmanager
def _named(file: Path, line: int, what: str) -> Iterator[None]:
    try:
        yield
    except Exception as err:  # TVM raises its C++ errors as Python exceptions of several types
        raise TuningLogError(f"{file}: line {line}: {what}: {_reason(err)}") from err


def _reason(err: Exception) -> str:
    """The last line of a TVM error (the first repeats the whole input)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[-1][:300]


def _read(file: Path) -> str:
    """The text of `file`, unpacked if it is a packed table (`.xz`); `TuningLogError` naming it if it cannot be
    read, is not xz (packed) or is not UTF-8."""
    try:
        data = file.read_bytes()
        return (lzma.decompress(data) if file.suffix == ".xz" else data).decode()
    except lzma.LZMAError as err:
        raise TuningLogError(f"{file}: not an xz file: {err}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TuningLogError(f"{file}: unreadable ({err})") from None


def _parse(text: str):
    """JSON as MetaSchedule writes it: no NaN, no infinity (ValueError; RecursionError if nested too deep)."""
    return json.loads(text, parse_float=_finite, parse_constant=_finite)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _check_lines(file: Path, check: Callable[[object], None]) -> list:
    """The lines of the MetaSchedule table `file` (none if it does not exist) parsed, each passed to `check`;
    `TuningLogError` naming the file and line."""
    lines = _read(file).split("\n") if file.exists() else [""]
    if lines[-1] == "":  # what follows the newline that ends the last line
        lines.pop()
    values = []
    for i, text in enumerate(lines, 1):
        try:
            values.append(_parse(text))
            check(values[-1])
        except (ValueError, RecursionError) as err:
            raise TuningLogError(f"{file}: line {i}: {err}") from None
    return values


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_index(value, n: int) -> bool:
    """`value` is an int (not a bool) in [0, n)."""
    return type(value) is int and 0 <= value < n


def _check_workload_line(line) -> None:
    """[structural hash, serialised IRModule]: base64 of a length-prefixed JSON object graph."""
    _require(
        isinstance(line, list) and len(line) == 2 and all(type(x) is str for x in line),
        "expected [structural hash, serialised IRModule]",
    )
    _require(line[0].isascii() and line[0].isdigit(), "the structural hash is not a decimal number")
    try:
        raw = base64.b64decode(line[1], validate=True)
        _require(len(raw) >= 8 and int.from_bytes(raw[:8], "little") == len(raw) - 8, "its length prefix is wrong")
        _check_graph(_parse(raw[8:].decode()))
    except ValueError as err:  # binascii.Error and UnicodeDecodeError among them
        raise ValueError(f"serialised IRModule: {err}") from None


def _check_graph(graph) -> None:
    """A JSON object graph as tvm_ffi writes it: nodes that refer only to nodes before them, no container holding
    None. TVM's reader follows references without a cycle check, and a null function crashes the structural hash."""
    _require(isinstance(graph, dict) and isinstance(graph.get("nodes"), list), "expected a JSON object graph")
    nodes = graph["nodes"]
    _require(_is_index(graph.get("root_index"), len(nodes)), "root_index: expected the index of a node")
    for n, node in enumerate(nodes):
        _require(isinstance(node, dict) and type(node.get("type")) is str, f"node {n}: expected a typed node")
        for ref in _references(node):
            _require(_is_index(ref, n), f"node {n} ({node['type']}) refers to {ref!r}, not to a node before it")
            _require(node["type"] not in _CONTAINERS or nodes[ref]["type"] != "None", f"node {n} holds None")


_CONTAINERS = ("ffi.Array", "ffi.List", "ffi.Map", "ffi.Dict")  # data: a list of node indices
_INLINE = (0, 1, 2, 3, 5)  # tvm_ffi type indices of None, int, bool, float, dtype: field values stored in the node


def _references(node: dict) -> list:
    """The node indices in `node`'s data that tvm_ffi's graph reader follows."""
    data = node.get("data")
    if node["type"] in _CONTAINERS:
        return data if isinstance(data, list) else []
    return [data[f] for f in _reference_fields(node["type"]) if f in data] if isinstance(data, dict) else []


@functools.cache
def _reference_fields(type_key: str) -> tuple[str, ...]:
    """The fields of objects of `type_key` that hold node indices: all but inline ones, none for a type with its own
    JSON reader or unknown to tvm_ffi. (tvm_ffi's reflection has no public lookup by key; it is pinned with TVM.)"""
    index = ffi_core._object_type_key_to_index(type_key)
    if index is None or ffi_core._lookup_type_attr(index, "__data_from_json__") is not None:
        return ()
    fields: list[str] = []
    info = ffi_core._type_index_to_type_info(index)
    while info is not None:  # the type's fields and its ancestors'
        fields += [f.name for f in info.fields if f.field_static_type_index not in _INLINE]
        info = info.parent_type_info
    return tuple(fields)


def _check_record_line(line, n_workloads: int, kind: str) -> None:
    """[workload index, [trace, run_secs, target, args]], tuned for target kind `kind`."""
    _require(
        isinstance(line, list) and len(line) == 2 and isinstance(line[1], list) and len(line[1]) == 4,
        "expected [workload index, [trace, run_secs, target, args]]",
    )
    index, (trace, run_secs, target, args) = line
    _require(_is_index(index, n_workloads), f"workload index {index!r} outside the {n_workloads} workloads")
    _check_trace(trace)
    _require(
        isinstance(run_secs, list)
        and len(run_secs) > 0
        and all(type(s) in (int, float) and 0 <= s <= MAX_SECS for s in run_secs),
        f"run_secs: expected seconds in [0, {MAX_SECS:g}]",
    )
    _require(isinstance(target, dict), "target: expected an object")
    _require(
        target.get("kind") == kind, f"foreign log: tuned for target {target.get('kind')!r}, this folder is for {kind!r}"
    )
    _require(
        isinstance(args, list) and all(_is_tensor_info(arg) for arg in args),
        'args: expected a list of ["TENSOR", dtype, shape]',
    )


def _is_tensor_info(arg) -> bool:
    """["TENSOR", dtype, shape of ints] (TVM's reader dereferences a null in the shape)."""
    return (
        isinstance(arg, list)
        and len(arg) == 3
        and arg[0] == "TENSOR"
        and type(arg[1]) is str
        and isinstance(arg[2], list)
        and all(type(d) is int for d in arg[2])
    )


# Attributes an instruction takes as optional, null where absent: TransformLayout's [buffer index, buffer index type,
# pad_value, assume_injective_transform] (the tensor-core GEMVs' fragment layouts have no pad value).
NULLABLE_ATTRS = {"TransformLayout": (2,)}


def _check_trace(trace) -> None:
    """[instructions, decisions]: each instruction [kind, inputs, attrs, outputs], each decision [the index of its
    instruction, value]; no null (MetaSchedule writes "None" for an absent random variable, and TVM's instructions
    dereference a null they do not expect) but in `NULLABLE_ATTRS`; an input that is a serialised object (an index
    map) a JSON object graph."""
    _require(
        isinstance(trace, list) and len(trace) == 2 and all(isinstance(x, list) for x in trace),
        "trace: expected [instructions, decisions]",
    )
    insts, decisions = trace
    for i, inst in enumerate(insts):
        _require(
            isinstance(inst, list)
            and len(inst) == 4
            and type(inst[0]) is str
            and all(isinstance(x, list) for x in inst[1:])
            and all(type(x) is str for x in inst[3]),
            f"trace instruction {i}: expected [kind, inputs, attrs, outputs]",
        )
        attrs = [a for j, a in enumerate(inst[2]) if j not in NULLABLE_ATTRS.get(inst[0], ())]
        _require(None not in _leaves([inst[1], attrs, inst[3]]), f"trace instruction {i}: null")
        for value in _leaves(inst[1]):
            if type(value) is str and value[:1] == "{" and value[-1:] == "}":
                _check_graph(_parse(value))
    for decision in decisions:
        _require(
            isinstance(decision, list) and len(decision) == 2 and _is_index(decision[0], len(insts)),
            f"trace decision {decision!r}: expected [instruction index, value]",
        )
        _require(None not in _leaves(decision), f"trace decision {decision!r}: null")


def _leaves(value) -> Iterator:
    """The values in `value`, its lists and objects flattened."""
    if isinstance(value, list | dict):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _leaves(item)
    else:
        yield value


def best(db: ms.database.Database, w: Workload) -> ms.database.TuningRecord | None:
    """The fastest record of `w` in `db` (matched by workload only), or None."""
    if not db.has_workload(w.mod):
        return None
    top = db.get_top_k(db.commit_workload(w.mod), 1)
    return top[0] if top else None


def lookup(root: str | Path, w: Workload) -> Found:
    """The best record of `w` under `root`: `MissingRecordError` without a log, or for a log of another definition
    of the op; `TuningLogError` for a log that cannot be used."""
    path = folder(root, w)
    if not has_log(path):
        raise MissingRecordError(f"no tuning record for workload {w.key} (op {w.op.name}): no log in {path}")
    compiler = read_summary(path).get("compiler") if (path / SUMMARY).exists() else None
    db = open_db(path, w)
    if not db.has_workload(w.mod):
        raise MissingRecordError(
            f"no tuning record for workload {w.key} (op {w.op.name}): {path / HASH} holds another "
            "definition (the op changed since it was tuned; re-tune it with --force)"
        )
    record = best(db, w)
    file = record_file(path)
    if record is None:
        raise TuningLogError(f"{file}: no usable record of {w.key} (each failed or has an empty trace)")
    digest = hashlib.sha256(_read(file).encode()).hexdigest()[:16]  # of the text: packed or not
    return Found(record, path, digest, compiler)


def replay(record: ms.database.TuningRecord, w: Workload, log: Path) -> s_tir.Schedule:
    """`record`'s trace (from the log folder `log`) replayed on the general function."""
    # `Op.definition` names it "main" already. Not `with_attr` here: a schedule over a fresh PrimFunc that shares
    # its body with `w.general` rewrites that body in place, and with it the workload tuning records refer to.
    sch = s_tir.Schedule(w.general)
    try:
        record.trace.apply_to_schedule(sch, remove_postproc=False)
    except Exception as err:  # a schedule error of any primitive in the trace
        raise TuningLogError(f"{record_file(log)}: the trace does not replay on {w.op.name}: {err}") from err
    return sch


def prune(path: Path, w: Workload, record: ms.database.TuningRecord) -> None:
    """Replace the log in `path` by `record`, a record of `w`: its line as MetaSchedule writes it, packed, and the
    structural hash of `w.mod`."""
    with tempfile.TemporaryDirectory() as tmp:
        out = ms.database.JSONDatabase(work_dir=tmp, allow_missing=True)
        out.commit_tuning_record(
            ms.database.TuningRecord(
                record.trace, out.commit_workload(w.mod), record.run_secs, record.target, record.args_info
            )
        )
        line = (Path(tmp) / RECORDS).read_bytes()
    drop(path)
    (path / PACKED_RECORDS).write_bytes(lzma.compress(line, preset=9))
    write_hash(path, w)


def drop(path: Path) -> None:
    """Delete the pruned log in `path` (records, workload hash, summary); a scratch database stays."""
    for name in (RECORDS, PACKED_RECORDS, HASH, SUMMARY):
        (path / name).unlink(missing_ok=True)


def seed_scratch(path: Path, w: Workload) -> None:
    """Start a scratch database from the pruned log of `w` in `path` (so a forced re-tune keeps the best of old and
    new): the workload table of `w.mod` and the log's record file, whose workload index 0 is that one workload. A
    scratch database already begun is left as it is."""
    scratch = path / SCRATCH
    if (scratch / WORKLOADS).exists() or (scratch / RECORDS).exists():
        return
    lines = _read(record_file(path))
    scratch.mkdir(parents=True, exist_ok=True)
    ms.database.JSONDatabase(work_dir=str(scratch), allow_missing=True).commit_workload(w.mod)
    (scratch / RECORDS).write_text(lines)


def write_hash(path: Path, w: Workload) -> None:
    """The hash file of a log of `w` in `path`: `{"structural_hash": <the hash of w.mod>}`."""
    (path / HASH).write_text(json.dumps({HASH_FIELD: structural_hash(w)}) + "\n")


def write_summary(path: Path, summary: dict) -> None:
    (path / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")


def read_summary(path: Path) -> dict:
    """`summary.json` in `path`: an object with the `SUMMARY_FIELDS` of their types; `TuningLogError` otherwise."""
    file = path / SUMMARY
    try:
        summary = _parse(_read(file))
        _require(isinstance(summary, dict), "expected an object")
        for name, kind in SUMMARY_FIELDS.items():
            if name != "compiler" or name in summary:  # only CUDA logs name their compiler
                _require(type(summary.get(name)) is kind, f"{name}: expected {kind.__name__}")
        _require(all(type(op) is str for op in summary["ops"]), "ops: expected names")
    except (ValueError, RecursionError) as err:
        raise TuningLogError(f"{file}: unreadable ({err}); re-tune the workload with --force") from None
    return summary
