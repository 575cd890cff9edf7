"""Damaged builds: every malformed or edited manifest and every truncated or altered library ends in a
`ManifestError` naming the file, before the library reaches `tvm.runtime.load_module`; a manifest loads only where
it is equivalent to the one built.

Equivalent means: every field that `load` reads is as built. `load` reads `format`, `target`, `tvm`, `config`,
`library`, `library_bytes`, `library_sha256`, `digest` and `functions`, of each function only its `args`; the rest
(the key, the target's JSON, the hand schedule list, the CUDA compiler, each function's workload, schedule, record,
tuned time and compiler) is provenance, free to change. An edited read field must be refused even when it is
well-formed (a bound, a shape): the manifest's digest covers them.

A bad library can kill the process that loads it (SIGBUS), so libraries are loaded by `loader`: one runtime-only
interpreter that imports TVM once (~4 s: tvm_ffi imports torch) and forks a child for each load, reporting how the
child ended; a crash is a child killed by a signal. A manifest is checked before its (intact) library is loaded,
so edited manifests load in this process.

Hypothesis runs derandomized (the same cases every run). Outcomes are tallied per module and printed at its end:
`pytest -s -p no:xdist tests/test_manifest_fuzz.py` shows the counts.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import child_loader
from hypothesis import given, settings
from hypothesis import strategies as st
from test_export import CFG, quiet

from gdn_tvm.export.artifact import build
from gdn_tvm.runtime import module
from gdn_tvm.runtime.module import MANIFEST, ManifestError, load
from gdn_tvm.target import llvm

TALLY: Counter[str] = Counter()
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
READ = {"format", "target", "tvm", "config", "library", "library_bytes", "library_sha256", "digest", "functions"}
DELETE = object()
ARG0 = ("functions", "sigmoid_gate", "args", 0)
# Loads each library path read from stdin in a forked child and prints the child's outcome, then "exit <status>"
# (negative: killed by that signal). argv: preset name, batch, max_len.
LOADER = """
import os, signal, sys
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.runtime.module import ManifestError, load
cfg = DecodeConfig(
    preset(sys.argv[1]), batch=int(sys.argv[2]), max_len=int(sys.argv[3]), weight_dtype="float32", kv_dtype="float32"
)
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a hung load ends as a crash
        try:
            load(line.strip(), cfg, "llvm")
            print("loaded", flush=True)
        except ManifestError as err:
            print("ManifestError:", str(err).replace("\\n", " "), flush=True)
        except Exception as err:
            print(f"{type(err).__name__}:", str(err).replace("\\n", " "), flush=True)
        os._exit(0)
    print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def fuzz(max_examples: int):
    """Deterministic hypothesis settings, no per-case deadline."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None)


@pytest.fixture(scope="module", autouse=True)
def tally():
    TALLY.clear()
    yield
    print(f"\n{__name__}: {dict(TALLY)}")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A build folder holding only `sigmoid_gate` (hand schedule), built once per module."""
    root = tmp_path_factory.mktemp("built")
    return build(CFG, llvm(), root / "logs", root, allow_hand=True, names=["sigmoid_gate"], echo=quiet).parent


@pytest.fixture(scope="module")
def for_manifests(built, tmp_path_factory) -> Path:
    """A copy of `built` whose manifest tests overwrite (its library stays intact)."""
    return Path(shutil.copytree(built, tmp_path_factory.mktemp("manifests") / built.name))


@pytest.fixture(scope="module")
def for_libraries(built, tmp_path_factory) -> Path:
    """A copy of `built` whose library tests overwrite (its manifest stays intact)."""
    return Path(shutil.copytree(built, tmp_path_factory.mktemp("libraries") / built.name))


@pytest.fixture(scope="module")
def loader():
    """`loader(folder)` -> (what the child loading that build printed, its exit status)."""
    argv = [sys.executable, "-c", LOADER, CFG.model.name, str(CFG.batch), str(CFG.max_len)]
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    with child_loader(argv, env) as run:
        yield run


def edited(manifest: object, path: tuple, value: object = DELETE) -> object:
    """A copy of `manifest` with the field or item at `path` set to `value` (deleted by default)."""
    if not path:
        return value
    new = copy.deepcopy(manifest)
    parent = new
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return new


def paths(node: object, prefix: tuple = ()):
    """The path of `node` and of every field and item under it."""
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from paths(child, (*prefix, key))


def changed(a: object, b: object, path: tuple = ()):
    """The paths where JSON values `a` and `b` differ (a value of another type differs)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            yield from changed(a.get(key, DELETE), b.get(key, DELETE), (*path, key))
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from changed(x, y, (*path, i))
    elif type(a) is not type(b) or a != b:
        yield path


def read_by_load(path: tuple) -> bool:
    """Whether `load` reads the manifest field at `path` (the whole manifest, a `READ` field, a function's args and
    library)."""
    if path[:1] == ("functions",) and len(path) >= 3:
        return path[2] in ("args", "library")
    return not path or path[0] in READ


def signatures(kernels: dict) -> dict:
    return {name: kernel.signature for name, kernel in kernels.items()}


def attempt(folder: Path, manifest_text: str) -> dict | ManifestError:
    """`load`'s kernels, or the `ManifestError` it raised, for `folder` with `manifest_text` as its manifest; any
    other exception is tallied as an unnamed error."""
    TALLY["manifest cases"] += 1
    (folder / MANIFEST).write_text(manifest_text)
    try:
        return load(folder, CFG, "llvm")
    except ManifestError as err:
        return err
    except Exception:
        TALLY["unnamed errors"] += 1
        raise


def expect_error(got: dict | ManifestError, *names: str) -> None:
    """`got` is a `ManifestError` whose message holds every one of `names` (the file, the field)."""
    if not isinstance(got, ManifestError):
        TALLY["silent successes"] += 1
        pytest.fail(f"loaded {sorted(got)} from a manifest it should refuse")
    assert all(name in str(got) for name in names), f"{got!r} does not name {names}"
    TALLY["named errors"] += 1


# (path, value, what the error names): the manifest's field at path set to value (DELETE: removed).
MALFORMED = [
    ((), [], "manifest: expected a JSON object"),
    ((), None, "manifest: expected a JSON object"),
    (("format",), 4, "format: expected 5"),
    (("library",), DELETE, "library: expected a file name in the build folder, got nothing"),
    (("library",), 7, "library: expected a file name"),
    (("library",), "../x.so", "library: expected a file name"),
    (("library",), "/tmp/x.so", "library: expected a file name"),
    (("library_bytes",), "19392", "library_bytes: expected a byte count"),
    (("library_sha256",), DELETE, "library_sha256: expected a SHA-256"),
    (("config",), [], "config: expected an object"),
    (("functions",), DELETE, "functions: expected a non-empty object"),
    (("functions",), {}, "functions: expected a non-empty object"),
    (("functions",), [], "functions: expected a non-empty object"),
    (("functions", "sigmoid_gate"), None, "functions.sigmoid_gate: expected an object"),
    (("functions", "sigmoid_gate", "args"), DELETE, "functions.sigmoid_gate.args: expected a list"),
    (("functions", "sigmoid_gate", "library"), "cutlass", "functions.sigmoid_gate.library: expected absent or one of"),
    (ARG0, "x", "functions.sigmoid_gate.args[0]: expected an object"),
    ((*ARG0, "name"), DELETE, "args[0].name: expected a non-empty string, got nothing"),
    ((*ARG0, "name"), "gate", "functions.sigmoid_gate.args: expected distinct names"),
    ((*ARG0, "shape"), "1x8x256", "args[0].shape: expected a list of ints >= 0"),
    ((*ARG0, "shape"), [1, -8, 256], "args[0].shape: expected a list of ints >= 0"),
    ((*ARG0, "shape"), [1, 8.0, 256], "args[0].shape: expected a list of ints >= 0"),
    ((*ARG0, "shape"), [1, True, 256], "args[0].shape: expected a list of ints >= 0"),
    ((*ARG0, "dtype"), DELETE, "args[0].dtype: expected a dtype"),
    ((*ARG0, "dtype"), "f4", "args[0].dtype: expected a dtype"),
    ((*ARG0, "role"), "input", "args[0].role: expected one of in, weight, out, state, index, scratch, counter"),
    ((*ARG0, "role"), "index", "args[0].bound: expected [lo, hi] for an index"),
    ((*ARG0, "bound"), [0], "args[0].bound: expected null or [lo, hi]"),
    ((*ARG0, "bound"), [4, 0], "args[0].bound: expected null or [lo, hi]"),
    ((*ARG0, "alias"), 1, "args[0].alias: expected null or an argument name"),
    ((*ARG0, "alias"), "state", "args[0].alias: expected an argument name"),
    ((*ARG0, "slot_pool"), "no", "args[0].slot_pool: expected true or false"),
    ((*ARG0, "sample"), None, "args[0]: expected only the fields"),
    ((*ARG0, "shape", 2), 128, "edited or corrupt"),  # well-formed, but not what was built
    ((*ARG0, "bound"), [0, 4], "edited or corrupt"),
    (("functions", "sigmoid_gate", "args"), [], "edited or corrupt"),
    (("config", "model", "extra"), 1, "edited or corrupt"),
    (("digest",), "0" * 64, "edited or corrupt"),
]


@pytest.mark.parametrize(
    "path, value, names",
    MALFORMED,
    ids=[
        (".".join(map(str, p)) or "manifest") + ("-deleted" if v is DELETE else f"={json.dumps(v)}"[:40])
        for p, v, _ in MALFORMED
    ],
)
def test_malformed_or_edited_manifest_is_named(built, for_manifests, path, value, names):
    original = json.loads((built / MANIFEST).read_text())
    got = attempt(for_manifests, json.dumps(edited(original, path, value)))
    expect_error(got, f"{for_manifests / MANIFEST}: ", names)


@pytest.mark.parametrize("text", ["{", "[" * 200_000 + "]" * 200_000], ids=["cut", "nested past the JSON reader"])
def test_manifest_that_is_not_json_is_named(for_manifests, text):
    expect_error(attempt(for_manifests, text), f"{for_manifests / MANIFEST}: not JSON")


def test_manifest_that_cannot_be_read_is_named(for_manifests, monkeypatch):
    def failing(*_args, **_kwargs):
        raise OSError(5, "Input/output error")

    (for_manifests / MANIFEST).write_text("{}")
    monkeypatch.setattr(Path, "read_text", failing)
    with pytest.raises(ManifestError, match=f"{re.escape(str(for_manifests / MANIFEST))}: unreadable: .*Input/output"):
        load(for_manifests, CFG, "llvm")


def edit(data: st.DataObject, original: dict) -> str:
    """`original`'s JSON text after one edit: a field or item at any depth replaced by a random JSON value (an int
    also nudged by -2..2), deleted or given a new field; or the text cut short."""
    text = json.dumps(original, indent=1)
    path = data.draw(st.sampled_from(list(paths(original))), label="path")
    node = original
    for key in path:
        node = node[key]
    kinds = ["replace", "cut the text"] + ["delete"] * bool(path) + ["add a field"] * isinstance(node, dict)
    kinds += ["nudge"] * (isinstance(node, int) and not isinstance(node, bool))
    kind = data.draw(st.sampled_from(kinds), label="edit")
    if kind == "cut the text":
        return text[: data.draw(st.integers(0, len(text)), label="length")]
    if kind == "add a field":
        path = (*path, data.draw(st.text(max_size=8), label="field"))
    values = {"delete": st.just(DELETE), "nudge": st.integers(-2, 2).map(lambda d: node + d)}
    return json.dumps(edited(original, path, data.draw(values.get(kind, JSON), label="value")))


@fuzz(500)
@given(data=st.data())
def test_edited_manifest_loads_only_when_equivalent(built, for_manifests, data):
    original = json.loads((built / MANIFEST).read_text())
    text = edit(data, original)
    try:
        equivalent = not any(map(read_by_load, changed(original, json.loads(text))))
    except ValueError:  # not JSON
        equivalent = False
    got = attempt(for_manifests, text)
    if equivalent:
        assert not isinstance(got, ManifestError), f"an equivalent manifest was refused: {got}"
        assert signatures(got) == signatures(load(built, CFG, "llvm"))
        TALLY["equivalent manifests loaded"] += 1
    else:
        expect_error(got, str(for_manifests / MANIFEST))


def damaged(data: bytes, how: tuple) -> bytes:
    """`data` truncated at `("truncate", n)`, with byte i XORed by x at `("flip", i, x)`, or `("append", tail)`."""
    if how[0] == "truncate":
        return data[: how[1]]
    if how[0] == "flip":
        _, i, x = how
        return data[:i] + bytes([data[i] ^ x]) + data[i + 1 :]
    return data + how[1]


def damages(size: int):
    return st.one_of(
        st.tuples(st.just("truncate"), st.integers(0, size - 1)),
        st.tuples(st.just("flip"), st.integers(0, size - 1), st.integers(1, 255)),
        st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    )


@fuzz(40)
@given(data=st.data())
def test_damaged_library_is_named_before_it_is_loaded(built, for_libraries, loader, data):
    library = for_libraries / f"{for_libraries.name}.so"
    pristine = (built / library.name).read_bytes()
    library.write_bytes(damaged(pristine, data.draw(damages(len(pristine)), label="damage")))
    said, status = loader(for_libraries)
    TALLY["library cases"] += 1
    if status < 0:
        TALLY["crashes"] += 1
        pytest.fail(f"the loading process was killed by signal {-status}")
    if said == "loaded":
        TALLY["silent successes"] += 1
        pytest.fail("a damaged library loaded")
    assert status == 0 and said.startswith(f"ManifestError: {library}"), said
    TALLY["named errors"] += 1


def test_a_config_nested_past_what_reads_it_is_named(built, for_manifests):
    """Nesting the JSON reader takes but the config's flattening and the digest do not."""
    deep: object = 1
    for _ in range(600):  # the JSON reader takes ~980 levels here
        deep = {"a": deep}
    original = json.loads((built / MANIFEST).read_text())
    got = attempt(for_manifests, json.dumps(edited(original, ("config", "x"), deep)))
    expect_error(got, f"{for_manifests / MANIFEST}: config: nested deeper than a build's config is")


def test_a_mismatch_names_a_huge_field_in_a_line(built, for_manifests):
    original = json.loads((built / MANIFEST).read_text())
    got = attempt(for_manifests, json.dumps(edited(original, ("tvm",), "9" * 2_000_000)))
    expect_error(got, f"{for_manifests / MANIFEST} does not match the request: tvm='999")
    assert len(str(got)) < 1000


def test_a_null_library_field_is_an_absent_one(built, for_manifests):
    """The digest reads a function's `library: null` as no library: so does `load` (a TVM function, not a call)."""
    original = json.loads((built / MANIFEST).read_text())
    got = attempt(for_manifests, json.dumps(edited(original, ("functions", "sigmoid_gate", "library"), None)))
    assert sorted(got) == ["sigmoid_gate"]


@pytest.mark.parametrize("where", ["folder", "library"])
def test_a_build_that_cannot_be_read_is_named(built, tmp_path, monkeypatch, where):
    """A folder on the way that cannot be searched, or a library that cannot be read (root reads everything, so
    the refusal is simulated)."""
    folder = Path(shutil.copytree(built, tmp_path / built.name))
    library = folder / json.loads((folder / MANIFEST).read_text())["library"]
    if where == "folder":
        real = Path.is_file
        monkeypatch.setattr(Path, "is_file", lambda p: _denied(p) if p.parent == folder else real(p))
        match = f"{folder / MANIFEST}: unreadable: "
    else:
        monkeypatch.setattr(module, "file_sha256", _denied)
        match = f"{library}: unreadable: "
    with pytest.raises(ManifestError, match=re.escape(match) + ".*Permission denied"):
        load(folder, CFG, "llvm")


def _denied(path: Path):
    raise PermissionError(13, "Permission denied", str(path))


def test_an_intact_library_this_machine_cannot_load_is_named(built, tmp_path):
    """A library whose manifest records it as it is (bytes, SHA-256, digest) but that the dynamic loader refuses
    (built against another C library, or not a library at all)."""
    folder = Path(shutil.copytree(built, tmp_path / built.name))
    manifest = json.loads((folder / MANIFEST).read_text())
    library = folder / manifest["library"]
    library.write_text("not a shared library\n")
    manifest |= {"library_bytes": library.stat().st_size, "library_sha256": module.file_sha256(library)}
    manifest["digest"] = module.digest(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=re.escape(f"{library}: cannot be loaded here: ")):
        load(folder, CFG, "llvm")
