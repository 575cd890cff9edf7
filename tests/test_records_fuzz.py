"""Damaged tuning logs: every damaged or edited log ends in a `TuningLogError` naming the file (and the line or
field), in `MissingRecordError` where the log holds another definition, or in a lookup that succeeds, and then
only where the log is still valid.

The base is a committed log, tuning_logs/cuda/gates-f32-B1-Hv16 (a lookup needs no GPU). Valid means: what
records.py checks is as MetaSchedule writes it, the rest is TVM's to judge. Free parts may change and the lookup
must still succeed: the values of summary.json's fields (of their types; `compiler` may go, unknown fields are
ignored) and run_secs (seconds in [0, 1e10]). TVM judges the trace (it must replay), the target's attributes other
than its kind (the build compiles for its own target) and the args. Another integer as the workload hash is another
definition (`MissingRecordError`). Any other edit must end in a `TuningLogError`.

A scratch database (MetaSchedule's JSON database while a workload is tuned) holds a workload table in place of the
hash: the base is the workload table MetaSchedule writes for the log's workload beside the log's record. There the
workload line's structural hash is free (decimal; TVM recomputes it) and TVM judges the serialised IRModule (one that
deserialises to another module is another definition: the scratch database holds no record of the workload).

TVM's readers trust what they read (a cyclic IRModule graph or a trace decision out of range crashes them), so the
Python checks run first, in this process, with TVM's loading stubbed out; a case that passes them goes to `loader`:
one interpreter that imports TVM once (~4 s) and forks a child for each lookup and replay, reporting how the child
ended; a crash is a child killed by a signal.

Hypothesis runs derandomized (the same cases every run). Outcomes are tallied per module and printed at its end:
`pytest -s -p no:xdist tests/test_records_fuzz.py` shows the counts.
"""

from __future__ import annotations

import base64
import json
import lzma
import math
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from conftest import F32, child_loader
from hypothesis import given
from hypothesis import strategies as st
from test_manifest_fuzz import DELETE, changed, edit, edited, fuzz
from tvm.s_tir import meta_schedule as ms

from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.tuning import records
from gdn_tvm.tuning.records import HASH, PACKED_RECORDS, RECORDS, SCRATCH, SUMMARY, WORKLOADS
from gdn_tvm.tuning.workload import workload

TALLY: Counter[str] = Counter()
W = workload(OPS["gates"], DecodeConfig(preset("qwen3.5-0.8b"), batch=1, **F32), "cuda")
LOGS = Path(__file__).parent.parent / "tuning_logs"
BASE = {name: (LOGS / W.key / name).read_bytes() for name in (HASH, SUMMARY)}
# The record file unpacked, as MetaSchedule writes it (a log may hold either form): edits and damage reach its JSON.
BASE[RECORDS] = lzma.decompress((LOGS / W.key / PACKED_RECORDS).read_bytes())
RECORD = json.loads(BASE[RECORDS])  # [workload index, [trace, run_secs, target, args]]
HASH_VALUE = json.loads(BASE[HASH])
INFO = json.loads(BASE[SUMMARY])


def workload_table(w) -> bytes:
    """The workload table MetaSchedule writes for `w`."""
    with tempfile.TemporaryDirectory() as scratch:
        ms.database.JSONDatabase(work_dir=scratch).commit_workload(w.mod)
        return (Path(scratch) / WORKLOADS).read_bytes()


SCRATCH_BASE = {WORKLOADS: workload_table(W), RECORDS: BASE[RECORDS]}  # a scratch database of W and the log's record
TABLE_LINE = json.loads(SCRATCH_BASE[WORKLOADS])  # [structural hash, serialised IRModule]
GRAPH = json.loads(base64.b64decode(TABLE_LINE[1])[8:])  # the IRModule as a tvm_ffi JSON object graph
# For each line "log <root>" read from stdin, looks up W under the log root in a forked child and replays the record;
# for "scratch <folder>", opens that scratch database and replays its best record of W ("no record" if none). Prints
# the child's outcome, then "exit <status>" (negative: killed by that signal).
LOADER = """
import os, signal, sys
from pathlib import Path
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.tuning import records
from gdn_tvm.tuning.workload import workload
w = workload(OPS["gates"], DecodeConfig(preset("qwen3.5-0.8b"), batch=1, weight_dtype="float32"), "cuda")
for line in sys.stdin:
    what, path = line.strip().split(" ", 1)
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hung load ends as a crash
        try:
            if what == "log":
                found = records.lookup(path, w)
                records.replay(found.record, w, found.folder)
                print("found", flush=True)
            elif (record := records.best(records.open_scratch(Path(path), "cuda"), w)) is not None:
                records.replay(record, w, Path(path))
                print("found", flush=True)
            else:
                print("no record", flush=True)
        except Exception as err:
            print(f"{type(err).__name__}:", str(err).replace("\\n", " "), flush=True)
        os._exit(0)
    print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class Reached(BaseException):
    """The Python checks passed: TVM would load the log next (not an `Exception`: records.py wraps TVM's errors)."""


@pytest.fixture(scope="module", autouse=True)
def tally():
    TALLY.clear()
    TALLY.update(dict.fromkeys(["crashes", "silent successes", "valid logs refused"], 0))  # printed even when 0
    yield
    print(f"\n{__name__}: {dict(TALLY)}")


@pytest.fixture(scope="module")
def loader():
    """`loader("log <root>" or "scratch <folder>")` -> (what the child printed, its exit status)."""
    argv = [sys.executable, "-c", LOADER]
    with child_loader(argv) as run:
        yield run


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The log root that each case overwrites."""
    return tmp_path_factory.mktemp("logs")


def table(line: object) -> bytes:
    """A workload table of `line`."""
    return (json.dumps(line) + "\n").encode()


def serialised(text: str) -> str:
    """An IRModule's JSON graph `text` as a workload line holds it: base64 of its length (8 bytes) and the text."""
    data = text.encode()
    return base64.b64encode(len(data).to_bytes(8, "little") + data).decode()


def finite(text: str) -> float:
    """A JSON number that is not NaN or infinite (ValueError otherwise)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


def lines(data: bytes, name: str) -> list | None:
    """The JSON values of a log file, one a line (summary.json and the hash file: one), or None if it does not
    parse."""
    try:
        text = (lzma.decompress(data) if name.endswith(".xz") else data).decode()
        split = [text] if name in (SUMMARY, HASH) else text.removesuffix("\n").split("\n")
        return [json.loads(line, parse_float=finite, parse_constant=finite) for line in split]
    except (ValueError, lzma.LZMAError):
        return None


def judge(files: dict[str, bytes | None]) -> str:
    """What a change of the base log (or, with a workload table, of the base scratch database) may end in: "free"
    (found), "tvm" (found or a named error), "another" (also `MissingRecordError`, or no record in a scratch
    database: the workload changed) or "invalid" (a `TuningLogError`); see the module docstring."""
    if files.get(PACKED_RECORDS) is not None:  # read in place of the plain record file
        try:
            files = files | {RECORDS: lzma.decompress(files[PACKED_RECORDS])}
        except lzma.LZMAError:
            return "invalid"
    base = SCRATCH_BASE if WORKLOADS in files else BASE
    verdicts = set()
    for name in base:
        data = files.get(name)
        if data is None:
            verdicts.add("free" if name == SUMMARY else "invalid")  # a log may come without its summary
            continue
        new = lines(data, name)
        if new is None:
            return "invalid"
        if name == SUMMARY:
            verdicts.add("free" if summary_ok(new[0]) else "invalid")
        elif name == HASH:
            verdicts.add(hash_verdict(new[0]))
        else:
            verdicts |= {part(name, new, path) for path in changed(lines(base[name], name), new)}
    return next((v for v in ("invalid", "another", "tvm") if v in verdicts), "free")


def hash_verdict(value: object) -> str:
    """{"structural_hash": an integer in [0, 2**64)}: "free" if it is the base hash, else "another"."""
    if not (isinstance(value, dict) and list(value) == ["structural_hash"]):
        return "invalid"
    shash = value["structural_hash"]
    if type(shash) is not int or not 0 <= shash < 2**64:
        return "invalid"
    return "free" if value == HASH_VALUE else "another"


def summary_ok(summary: object) -> bool:
    """The base summary's fields with values of their types (`compiler` may go), ops names; others ignored."""
    if not isinstance(summary, dict):
        return False
    kept = {key: summary.get(key, value if key == "compiler" else None) for key, value in INFO.items()}
    return all(type(kept[key]) is type(value) for key, value in INFO.items()) and all(
        type(op) is str for op in kept["ops"]
    )


def part(name: str, new: list, path: tuple) -> str:
    """The verdict for a change at `path` in the lines `new` of a table or record file."""
    if len(path) < 2:
        return "invalid"  # lines added or removed, a line replaced by a value of another type or length
    line, field = new[path[0]], path[1:]
    if name == WORKLOADS:
        if field == (0,):
            return "free" if type(line[0]) is str and line[0].isascii() and line[0].isdigit() else "invalid"
        return "another" if field == (1,) else "invalid"
    if field[:2] in ((1, 0), (1, 3)) or (field[:2] == (1, 2) and len(field) > 2 and field[2] != "kind"):
        return "tvm"  # the trace, the args, a target attribute other than the kind
    if field[:2] == (1, 1) and isinstance(secs := line[1][1], list) and secs:
        ok = all(type(s) in (int, float) and 0 <= s <= 1e10 for s in secs)
        return "free" if ok and any(np.float32(s) != 1e10 for s in secs) else "invalid"  # 1e10: a failed run
    return "invalid"


def attempt(root: Path, loader, files: dict[str, bytes | None]) -> str:
    """Look W up in a log of `files` (None: absent) under `root`, or, if `files` hold a workload table, open a
    scratch database of them there and take its best record of W: "found", "TuningLogError: <message>",
    "MissingRecordError: <message>" or "no record" (a scratch database). The Python checks run here; a log that
    passes them is looked up (and its record replayed) by the loader. A crash or any other exception fails the
    test."""
    folder = records.folder(root, W)
    shutil.rmtree(folder, ignore_errors=True)
    scratch = WORKLOADS in files
    where = folder / SCRATCH if scratch else folder
    where.mkdir(parents=True)
    for name, data in files.items():
        if data is not None:
            (where / name).write_bytes(data)
    TALLY["cases"] += 1
    try:
        with (
            mock.patch.object(records, "_load", side_effect=Reached),
            mock.patch.object(records.ms.database, "JSONDatabase", side_effect=Reached),
        ):
            records.open_scratch(where, W.kind) if scratch else records.lookup(root, W)
    except (records.TuningLogError, records.MissingRecordError) as err:
        TALLY["stopped by the Python checks"] += 1
        return f"{type(err).__name__}: {err}"
    except Reached:
        said, status = loader(f"scratch {where}" if scratch else f"log {root}")
        TALLY["loaded by TVM in a child"] += 1
        if status < 0:
            TALLY["crashes"] += 1
            pytest.fail(f"the loading process was killed by signal {-status}")
        assert status == 0 and said.startswith(("found", "no record", "TuningLogError:", "MissingRecordError:")), said
        return said
    raise AssertionError("the lookup returned with TVM's loading stubbed out")


def expect(got: str, verdict: str, *names: str) -> None:
    """`got` is what `verdict` allows (see `judge`); an error holds every one of `names` (the file, the field)."""
    if got == "found":
        if verdict not in ("free", "tvm", "another"):
            TALLY["silent successes"] += 1
            pytest.fail("an invalid log was looked up")
        TALLY["valid logs found"] += 1
        return
    if verdict == "free":
        TALLY["valid logs refused"] += 1
        pytest.fail(f"a valid log was refused: {got}")
    kind = got.split(":")[0]
    assert kind == "TuningLogError" or (kind in ("MissingRecordError", "no record") and verdict == "another"), got
    if kind == "no record":  # a scratch database of another workload: the tuner sets it aside, nothing to name
        TALLY["scratch databases of another workload"] += 1
        return
    assert all(name in got for name in names), f"{got!r} does not name {names}"
    TALLY["named errors"] += 1


def with_record(path: tuple, value: object = DELETE) -> dict[str, bytes | None]:
    """The base log, its record line's field or item at `path` set to `value` (deleted by default)."""
    return BASE | {RECORDS: (json.dumps(edited(RECORD, path, value)) + "\n").encode()}


def with_graph(path: tuple, value: object = DELETE) -> dict[str, bytes | None]:
    """The base scratch database, its IRModule's graph edited at `path`."""
    return SCRATCH_BASE | {WORKLOADS: table([TABLE_LINE[0], serialised(json.dumps(edited(GRAPH, path, value)))])}


def with_table(line: object) -> dict[str, bytes | None]:
    """The base scratch database, its workload table holding `line`."""
    return SCRATCH_BASE | {WORKLOADS: table(line)}


def with_hash(value: object) -> dict[str, bytes | None]:
    """The base log, its workload hash `value`."""
    return BASE | {HASH: json.dumps({"structural_hash": value}).encode()}


def with_summary(path: tuple, value: object = DELETE) -> dict[str, bytes | None]:
    """The base log, its summary edited at `path`."""
    return BASE | {SUMMARY: json.dumps(edited(INFO, path, value)).encode()}


TRACE, SECS, TARGET = (1, 0), (1, 1), (1, 2)
SPLIT = (*TRACE, 0, 4)  # ["Split", ["l4", "None", 128], [1, 0], ["l5", "l6"]]
FUNCTIONS = GRAPH["nodes"][GRAPH["root_index"]]["data"]["global_var_map_"]  # the node of {"main": GlobalVar}
CYCLE = {"root_index": 1, "nodes": [{"type": "None"}, {"type": "ffi.Array", "data": [1]}]}  # an array in itself
GARBAGE = bytes(range(128, 256)) * 3  # not UTF-8, not xz, not JSON
# (id, the log's files, the verdict, what the message must hold besides the file)
CASES = [
    ("records: random bytes", BASE | {RECORDS: GARBAGE}, "invalid", f"{RECORDS}: unreadable"),
    ("records: empty", BASE | {RECORDS: b""}, "invalid", f"{RECORDS}: empty"),
    ("records: missing beside the hash", BASE | {RECORDS: None}, "invalid", f"{RECORDS}: missing"),
    ("records: packed", BASE | {RECORDS: None, PACKED_RECORDS: lzma.compress(BASE[RECORDS])}, "free", ""),
    ("records: packed, not xz", BASE | {PACKED_RECORDS: GARBAGE}, "invalid", f"{PACKED_RECORDS}: not an xz file"),
    (
        "records: packed, read before the plain file",
        BASE | {PACKED_RECORDS: lzma.compress(BASE[RECORDS].replace(b"[0,[", b"[1,[", 1))},
        "invalid",
        f"{PACKED_RECORDS}: line 1: workload index 1",
    ),
    ("hash: missing (a log of the workload-table format)", BASE | {HASH: None}, "invalid", f"{HASH}: missing"),
    ("hash: random bytes", BASE | {HASH: GARBAGE}, "invalid", f"{HASH}: unreadable"),
    ("hash: truncated", BASE | {HASH: BASE[HASH][:-8]}, "invalid", f"{HASH}: unreadable"),
    ("hash: a list", BASE | {HASH: b"[1]"}, "invalid", 'expected {"structural_hash"'),
    ("hash: a string", with_hash(str(HASH_VALUE["structural_hash"])), "invalid", 'expected {"structural_hash"'),
    ("hash: a float", with_hash(float(HASH_VALUE["structural_hash"])), "invalid", 'expected {"structural_hash"'),
    ("hash: negative", with_hash(-1), "invalid", "an integer in [0, 2**64)"),
    ("hash: 2**64", with_hash(2**64), "invalid", "an integer in [0, 2**64)"),
    ("hash: a bool", with_hash(True), "invalid", 'expected {"structural_hash"'),
    ("hash: field missing", BASE | {HASH: b"{}"}, "invalid", 'expected {"structural_hash"'),
    ("hash: another field", BASE | {HASH: json.dumps(HASH_VALUE | {"op": "gates"}).encode()}, "invalid", "expected"),
    ("hash: another definition's", with_hash(HASH_VALUE["structural_hash"] ^ 1), "another", "holds another definition"),
    (
        "hash: another workload's log",
        {p.name: p.read_bytes() for p in (LOGS / "cuda/gates-f32-B1-Hv32").iterdir()},
        "another",
        "holds another definition",
    ),
    (
        "scratch table: another workload's",
        with_table(
            json.loads(workload_table(workload(OPS["gates"], DecodeConfig(preset("qwen3.5-4b"), **F32), "cuda")))
        ),
        "another",
        "",
    ),
    ("scratch table: missing", SCRATCH_BASE | {WORKLOADS: None}, "invalid", "workload index 0 outside the 0"),
    ("scratch table: random bytes", SCRATCH_BASE | {WORKLOADS: GARBAGE}, "invalid", f"{WORKLOADS}: unreadable"),
    ("scratch table: not JSON", SCRATCH_BASE | {WORKLOADS: b"[1,\n"}, "invalid", "line 1: Expecting value"),
    ("scratch table: JSON of another shape", with_table({"a": 1}), "invalid", "line 1: expected [structural"),
    ("scratch table: hash not a number", with_table(["x1", TABLE_LINE[1]]), "invalid", "structural hash"),
    ("scratch table: IRModule not base64", with_table([TABLE_LINE[0], "ab!"]), "another", "IRModule: "),
    # TVM allocates what the length prefix says (4 GiB here) before it fails.
    ("scratch table: length prefix", with_table([TABLE_LINE[0], "AAAAAAEAAAB7fQ=="]), "another", "length"),
    ("scratch table: IRModule graph not JSON", with_table([TABLE_LINE[0], serialised("{")]), "another", "Expecting"),
    ("scratch table: IRModule graph of another shape", with_graph((), [1]), "another", "expected a JSON object graph"),
    # TVM's reader follows a cycle until the stack overflows, and None in the function map crashes its hash.
    ("scratch table: IRModule graph cyclic", with_graph(("nodes", 9, "data", 0), 9), "another", "not to a node before"),
    (
        "scratch table: IRModule graph with None in a map",
        with_graph(("nodes", FUNCTIONS, "data", 1), 0),
        "another",
        "holds None",
    ),
    (
        "scratch table: IRModule that does not deserialise",
        with_graph(("nodes", 5, "type"), "no.Such"),
        "another",
        "MetaSchedule cannot load the database",
    ),
    ("summary: random bytes", BASE | {SUMMARY: GARBAGE}, "invalid", f"{SUMMARY}: unreadable"),
    ("summary: a list", BASE | {SUMMARY: b"[]"}, "invalid", "expected an object"),
    ("summary: trials a string", with_summary(("trials",), "6"), "invalid", "trials: expected int"),
    ("summary: ops of numbers", with_summary(("ops",), [1]), "invalid", "ops: expected names"),
    ("summary: best_us missing", with_summary(("best_us",)), "invalid", "best_us: expected float"),
    ("summary: best_us NaN", BASE | {SUMMARY: BASE[SUMMARY].replace(b"0.95", b"NaN")}, "invalid", "NaN"),
    ("record: not JSON", BASE | {RECORDS: b"[0, [[[], []], [1e-05"}, "invalid", f"{RECORDS}: line 1:"),
    ("record: a dict", BASE | {RECORDS: b'{"a": 1, "b": 2}'}, "invalid", "expected [workload index"),
    ("record: index out of range", with_record((0,), 1), "invalid", "workload index 1 outside"),
    ("record: index not an int", with_record((0,), "0"), "invalid", "workload index '0'"),
    ("record: index a bool", with_record((0,), False), "invalid", "workload index False"),
    ("record: trace not a list", with_record(TRACE, {}), "tvm", "trace: expected"),
    ("record: instruction not a list", with_record((*TRACE, 0, 0), 3), "tvm", "trace instruction 0"),
    # TVM stores a decision at its index unchecked; an index map input is a graph like an IRModule.
    ("record: decision out of range", with_record((*TRACE, 1), [[99, 1]]), "tvm", "trace decision [99, 1]"),
    ("record: input a cyclic graph", with_record((*SPLIT, 1, 0), json.dumps(CYCLE)), "tvm", "not to a node before"),
    ("record: run_secs of strings", with_record((*SECS, 0), "1e-6"), "invalid", "run_secs: expected seconds"),
    ("record: run_secs negative", with_record((*SECS, 0), -1e-6), "invalid", "run_secs"),
    ("record: run_secs empty", with_record(SECS, []), "invalid", "run_secs"),
    (
        "record: run_secs NaN",
        BASE | {RECORDS: BASE[RECORDS].replace(b"9.5275021574991124016e-07", b"NaN")},
        "invalid",
        "NaN is not a finite number",
    ),
    ("record: run_secs too large", with_record((*SECS, 0), 1e39), "invalid", "run_secs"),
    ("record: target a list", with_record(TARGET, ["cuda"]), "invalid", "target: expected an object"),
    ("record: target of another kind", with_record((*TARGET, "kind"), "llvm"), "invalid", "foreign log"),
    ("record: target TVM refuses", with_record((*TARGET, "arch"), 90), "tvm", "cannot load the record"),
    ("record: args not a list", with_record((1, 3), 5), "tvm", "args: expected a list"),
    ("record: trace does not replay", with_record((*TRACE, 0, 1, 2, 0), "nope"), "tvm", "cannot load the record"),
    ("record: only failed runs", with_record(SECS, [1e10]), "invalid", "no usable record"),
    ("free: run_secs", with_record(SECS, [2e-6]), "free", ""),
    ("free: the hash file's white space", BASE | {HASH: b" \n" + BASE[HASH].replace(b": ", b":\t")}, "free", ""),
    ("free: a scratch table's structural hash", with_table(["42", TABLE_LINE[1]]), "free", ""),
    ("free: summary values", with_summary(("note",), "edited"), "free", ""),
    ("free: an unknown summary field", with_summary(("extra",), 1), "free", ""),
    ("free: no compiler", with_summary(("compiler",)), "free", ""),
    ("free: no summary", BASE | {SUMMARY: None}, "free", ""),
]


@pytest.mark.parametrize("files, verdict, names", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reported_cases(root, loader, files, verdict, names):
    """Each case of the report, and the crashes the checks guard against, as a named error; free edits found."""
    assert judge(files) == verdict
    expect(attempt(root, loader, files), verdict, str(records.folder(root, W)), names)


def damage(data: bytes, how: tuple) -> bytes:
    """`data` truncated at `("truncate", n)`, byte i XORed by x at `("flip", i, x)`, bytes [i, j) replaced by `new`
    at `("replace", i, j, new)` (for j < i, `new` is inserted and bytes [j, i) repeat)."""
    if how[0] == "truncate":
        return data[: how[1]]
    if how[0] == "flip":
        _, i, x = how
        return data[:i] + bytes([data[i] ^ x]) + data[i + 1 :]
    _, i, j, new = how
    return data[:i] + new + data[j:]


def damages(size: int):
    """A `damage` to data of `size` bytes."""
    index = st.integers(0, size - 1)
    return st.one_of(
        st.tuples(st.just("truncate"), index),
        st.tuples(st.just("flip"), index, st.integers(1, 255)),
        st.tuples(st.just("replace"), index, index, st.binary(max_size=16)),
    )


@fuzz(500)
@given(data=st.data())
def test_damaged_log_is_named_or_still_valid(root, loader, data):
    """A file of the base log, or the workload table of the base scratch database, damaged."""
    name = data.draw(st.sampled_from([RECORDS, HASH, SUMMARY, WORKLOADS]), label="file")
    base = SCRATCH_BASE if name == WORKLOADS else BASE
    files = base | {name: damage(base[name], data.draw(damages(len(base[name])), label="damage"))}
    expect(attempt(root, loader, files), judge(files), str(records.folder(root, W)))


@fuzz(800)
@given(data=st.data())
def test_edited_log_is_named_or_still_valid(root, loader, data):
    """An edit at any depth of the record line, the summary, the workload hash, or a scratch database's workload line
    or its IRModule's graph."""
    where = data.draw(st.sampled_from(["record", "summary", "hash", "workload line", "graph"]), label="where")
    if where == "record":
        files = BASE | {RECORDS: edit(data, RECORD).encode() + b"\n"}
    elif where == "summary":
        files = BASE | {SUMMARY: edit(data, INFO).encode()}
    elif where == "hash":
        files = BASE | {HASH: edit(data, HASH_VALUE).encode()}
    elif where == "workload line":
        files = SCRATCH_BASE | {WORKLOADS: edit(data, TABLE_LINE).encode() + b"\n"}
    else:
        files = SCRATCH_BASE | {WORKLOADS: table([TABLE_LINE[0], serialised(edit(data, GRAPH))])}
    expect(attempt(root, loader, files), judge(files), str(records.folder(root, W)))


TENSOR_CORES = workload(OPS["gemv_in_proj_qkv"], DecodeConfig(preset("qwen3.5-4b"), batch=32), "cuda")


@pytest.mark.parametrize("attr, refused", [(2, False), (0, True), (3, True)], ids=["pad_value", "index", "injective"])
def test_transform_layout_null_only_as_its_pad_value(root, attr, refused):
    """A committed tensor-core record's TransformLayout instructions (the fragment layouts) have a null pad value,
    which the checks pass on to TVM; a null in another of its attributes is refused, naming the file."""
    source = LOGS / TENSOR_CORES.key
    (record,) = lines((source / PACKED_RECORDS).read_bytes(), PACKED_RECORDS)
    insts = record[1][0][0]
    layouts = [inst for inst in insts if inst[0] == "TransformLayout"]
    assert layouts and all(inst[2][2] is None for inst in layouts)
    for inst in layouts:
        inst[2][attr] = None
    folder = records.folder(root, TENSOR_CORES)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder)
    (folder / PACKED_RECORDS).unlink()
    (folder / RECORDS).write_text(json.dumps(record) + "\n")
    with mock.patch.object(records, "_load", side_effect=Reached), pytest.raises(BaseException) as caught:
        records.lookup(root, TENSOR_CORES)
    if refused:
        assert caught.type is records.TuningLogError and "null" in str(caught.value) and RECORDS in str(caught.value)
    else:
        assert caught.type is Reached
