"""MetaSchedule tuning on llvm by `python -m gdn_tvm.tuning` (a tiny run: small shapes, few trials, every op), then
`python -m gdn_tvm.export` from its logs, the exported module loaded and every op compared with its reference;
resume, --force, stale and bad logs."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import lzma
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import tvm
import tvm_ffi
from conftest import F32, check_kernel_against_reference
from tvm.s_tir import meta_schedule as ms

from gdn_tvm import naming
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.export.__main__ import main as build_main
from gdn_tvm.plan import step_ops
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.module import load
from gdn_tvm.target import llvm
from gdn_tvm.tuning import driver, measure, records
from gdn_tvm.tuning.__main__ import main as tune_main
from gdn_tvm.tuning.driver import tune, workloads
from gdn_tvm.tuning.space import hand_designs, knob_grid
from gdn_tvm.tuning.workload import workload

CFG = DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=64, **F32)
SHAPE_ARGS = [  # CFG on the command lines
    "--target", "llvm", "--preset", "qwen3.5-0.8b", "--max-len", "64",
    "--weight-dtype", "float32", "--kv-dtype", "float32",
]  # fmt: skip
# Element-wise; a positions index buffer; slots with an in-place state; two ops sharing one workload (deduplicated).
TUNE_OPS = ("sigmoid_gate", "partial_neox_rope", "causal_conv1d_silu", "gemv_in_proj_b", "gemv_in_proj_a")
TRIALS = 2


def quiet(_line: str) -> None:
    """Swallows the per-workload progress lines."""


@pytest.fixture(scope="session")
def tuned_logs(tmp_path_factory) -> Path:
    """`python -m gdn_tvm.tuning --ops all` (every registry op) at CFG, TRIALS trials each (about 3 minutes on
    2 cores), done once per test session: the first xdist worker tunes under a file lock; its output is kept in
    `tune.out`.

    Only this run searches (MetaSchedule's first TuneContext imports `tvm.s_tir.tensor_intrin`, about a minute of
    TVMScript parsing per process); the other tests re-measure the hand schedule at most (trials=0)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "tuned_logs"
    with open(shared / "tuned_logs.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            handler = signal.getsignal(signal.SIGINT)  # the command line sets its own
            with open(root / "tune.out", "w") as out, contextlib.redirect_stdout(out):
                status = tune_main([*SHAPE_ARGS, "--ops", "all", "--trials", str(TRIALS), "--work-dir", str(root)])
            signal.signal(signal.SIGINT, handler)
            assert status == 0, (root / "tune.out").read_text()
            (root / "done").touch()
    return root


def test_tune_command_tunes_every_op_and_prunes_to_the_best_record(tuned_logs):
    """A line per workload as it finishes and the final table; every workload's log pruned to one record no slower
    than the hand schedule."""
    names = [name for name, op in OPS.items() if op.applies(CFG)]  # `--ops all`: the library GEMMs need bf16 weights
    groups = workloads(CFG, "llvm", names)
    printed = (tuned_logs / "tune.out").read_text().splitlines()
    assert printed[0].startswith(f"tuning {len(groups)} workloads ({len(names)} ops) of {naming.build(CFG, 'llvm')}")
    for w, _ in groups:
        assert any(line.startswith(f"{w.key} [") for line in printed), f"no progress line for {w.key}"
        folder = tuned_logs / w.key
        pruned = [records.HASH, records.PACKED_RECORDS, records.SUMMARY]
        assert sorted(p.name for p in folder.iterdir()) == sorted(pruned)
        assert len(lzma.decompress((folder / records.PACKED_RECORDS).read_bytes()).splitlines()) == 1
        assert json.loads((folder / records.HASH).read_text()) == {"structural_hash": tvm_ffi.structural_hash(w.mod)}
        summary = json.loads((folder / records.SUMMARY).read_text())
        assert summary["best_us"] <= summary["hand_us"], f"{w.key}: tuned is slower than the hand schedule"
        assert summary["timing"] == "eager"  # llvm; CUDA candidates are timed as graph replays
    assert printed[-2].startswith("total") and printed[-1].startswith("done in")


def test_rerun_reports_recorded_workloads(tuned_logs):
    results = tune(CFG, llvm(), TUNE_OPS, tuned_logs, trials=TRIALS, echo=quiet)
    assert [r.status for r in results] == ["cached"] * len(results)
    assert ("gemv_in_proj_b", "gemv_in_proj_a") in [r.ops for r in results]


def test_force_tunes_further_and_keeps_the_best(tuned_logs, tmp_path):
    root = tmp_path / "logs"
    shutil.copytree(tuned_logs, root)
    (before,) = tune(CFG, llvm(), ["sigmoid_gate"], root, trials=TRIALS, echo=quiet)
    (after,) = tune(CFG, llvm(), ["sigmoid_gate"], root, trials=0, force=True, echo=quiet)
    assert (before.status, after.status) == ("cached", "tuned")
    assert after.best_us <= before.best_us
    assert not (root / after.key / records.SCRATCH).exists()


def test_tuning_times_a_mid_cache_step_on_distinct_slots():
    """Index buffers: positions at the middle of the cache (the mean step of a sequence that fills it), every lane
    on its own slot; the task is the op's definition itself, marked no-alias."""
    cfg = dataclasses.replace(CFG, batch=4, slots=8)
    for name in ("decode_attention_split", "decode_attention"):
        w = workload(OPS[name], cfg, "llvm")
        values = dict(zip([a.name for a in w.op.signature(cfg)], w.index_values, strict=True))
        assert values["positions"].tolist() == [cfg.max_len // 2] * 4 and values["slots"].tolist() == [0, 1, 2, 3]
        assert tvm_ffi.structural_equal(w.mod["main"], w.general.with_attr("tirx.noalias", True))


def test_interrupted_run_resumes_from_scratch(tuned_logs, tmp_path):
    """A scratch database without a pruned log (as an interrupted run leaves it) is continued, not restarted: a run
    cut after its hand record, the knob grid and the search budget measures only the hand schedule again. The
    scratch database starts as the pruned log: MetaSchedule's workload table of the workload, and its record."""
    w = workload(OPS["sigmoid_gate"], CFG, "llvm")
    grid, _ = hand_designs(w, tvm.s_tir.Schedule(w.mod))
    folder = tmp_path / w.key
    shutil.copytree(tuned_logs / w.key, folder)
    records.seed_scratch(folder, w)
    seeded = records.best(records.open_scratch(folder / records.SCRATCH, "llvm"), w)
    assert seeded is not None and seeded.as_json() == records.lookup(tmp_path, w).record.as_json()
    for name in (records.HASH, records.PACKED_RECORDS, records.SUMMARY):
        (folder / name).unlink()
    log = folder / records.SCRATCH / records.RECORDS
    prior = len(grid) + TRIALS  # the hand record, the rest of the grid, the search
    log.write_text(log.read_text() * prior)
    (result,) = tune(CFG, llvm(), ["sigmoid_gate"], tmp_path, trials=TRIALS, echo=quiet)
    assert (result.status, result.trials) == ("tuned", prior)  # nothing but the hand schedule was measured
    assert (folder / records.PACKED_RECORDS).exists() and not (folder / records.SCRATCH).exists()


def test_build_command_from_tuned_logs_matches_reference_for_every_op(tuned_logs, tmp_path, rng):
    """`python -m gdn_tvm.export`, strict: every op from its record; the exported module loaded with the runtime and
    each function compared with its reference."""
    assert build_main([*SHAPE_ARGS, "--ops", "all", "--work-dir", str(tuned_logs), "--out", str(tmp_path)]) == 0
    manifest = json.loads(next(tmp_path.glob("*/*/manifest.json")).read_text())
    functions = manifest["functions"]
    applying = [name for name, op in OPS.items() if op.applies(CFG)]  # `--ops all` (no library GEMM at f32 weights)
    assert sorted(functions) == sorted(applying) and {f["schedule"] for f in functions.values()} == {"tuned"}
    assert functions["gemv_in_proj_b"]["record"] == functions["gemv_in_proj_a"]["record"]
    kernels = load(tmp_path, CFG, "llvm")
    for name, kernel in kernels.items():
        check_kernel_against_reference(OPS[name], CFG, kernel, rng)


def test_commands_report_a_missing_record_and_an_unknown_op(tmp_path, capsys):
    assert build_main([*SHAPE_ARGS, "--work-dir", str(tmp_path), "--out", str(tmp_path / "build")]) == 1
    missing = len(workloads(CFG, "llvm", step_ops(CFG)))  # by default, what a step launches
    assert f"error: {missing} workload(s) without a tuning record" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune_main([*SHAPE_ARGS, "--ops", "sigmoid_gate,no_such_op", "--work-dir", str(tmp_path)])
    assert "unknown ops ['no_such_op']" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "batch must be in [1, 2**31), got 0"),
        (["--batch", "2147483648"], "batch must be in [1, 2**31)"),
        (["--batch", "4", "--slots", "2"], "slots=2 must be >= batch=4"),
        (["--split-len", "0"], "split_len must be"),
        (["--preset", "qwen3.5-35b-a3b", "--ops", "sigmoid_gate,gemv_gate_up_proj_swiglu"], "not an op of"),
        (["--work-dir", "{file}"], "not a folder"),
        (["--slots", "8193"], "slots=8193: the recurrent state pool would hold 2147745792 elements"),
        (["--ops", "sigmoid_gate,gates,sigmoid_gate"], "--ops names ['sigmoid_gate'] more than once"),
    ],
)
@pytest.mark.parametrize("command", ["build", "tune"])
def test_commands_refuse_bad_shapes_and_folders_by_name(tmp_path, capsys, command, args, message):
    """Before anything compiles: exit status 2 and a message naming the argument, never a traceback."""
    file = tmp_path / "a_file"
    file.write_text("")
    argv = [*SHAPE_ARGS, "--work-dir", str(tmp_path), *(a.format(file=file) for a in args)]
    with pytest.raises(SystemExit) as exit_:
        (build_main if command == "build" else tune_main)(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_build_refuses_an_out_folder_that_is_a_file_and_tune_negative_trials(tmp_path, capsys):
    file = tmp_path / "a_file"
    file.write_text("")
    with pytest.raises(SystemExit):
        build_main([*SHAPE_ARGS, "--work-dir", str(tmp_path), "--out", str(file)])
    assert f"--out {file}: not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune_main([*SHAPE_ARGS, "--trials", "-5", "--work-dir", str(tmp_path)])
    assert "--trials: expected 0 or more, got -5" in capsys.readouterr().err
    for command, option in ((build_main, "--out"), (tune_main, "--work-dir")):  # a folder under a file
        with pytest.raises(SystemExit) as exit_:
            command([*SHAPE_ARGS, "--work-dir", str(tmp_path), option, str(file / "sub")])
        assert exit_.value.code == 2
        assert (
            f"{option} {file / 'sub'}: cannot be written ({file} is not a writable folder)" in capsys.readouterr().err
        )


def _written_log(root: Path, record_line: str):
    """The sigmoid_gate workload and its log folder under `root`, holding its workload hash and `record_line`."""
    w = workload(OPS["sigmoid_gate"], CFG, "llvm")
    folder = records.folder(root, w)
    folder.mkdir(parents=True)
    records.write_hash(folder, w)
    (folder / records.RECORDS).write_text(record_line + "\n")
    return w, folder


def test_corrupt_log_is_an_error_naming_the_file(tmp_path):
    w, folder = _written_log(tmp_path, "[0, [[[], []], [1e-05")
    with pytest.raises(records.TuningLogError, match=str(folder / records.RECORDS)):
        records.lookup(tmp_path, w)
    with pytest.raises(records.TuningLogError, match=str(folder / records.RECORDS)):
        tune(CFG, llvm(), ["sigmoid_gate"], tmp_path, trials=1, echo=quiet)
    (folder / records.HASH).write_text('{"structural_hash": ')
    with pytest.raises(records.TuningLogError, match=f"{folder / records.HASH}: unreadable"):
        records.lookup(tmp_path, w)
    w, folder = _written_log(tmp_path / "packed", "[0, [[[], []], [1e-05")
    (folder / records.PACKED_RECORDS).write_text("not xz either")  # read in place of the plain record file
    with pytest.raises(records.TuningLogError, match=f"{folder / records.PACKED_RECORDS}: not an xz file"):
        records.lookup(tmp_path / "packed", w)


@pytest.mark.parametrize("broken", [records.HASH, records.RECORDS])
def test_an_unreadable_log_is_tuned_afresh_with_force_as_its_error_says(tmp_path, broken, capsys):
    """Without --force the tuner and the build stop naming the file and saying to pass it; with it, the log is
    replaced."""
    w, folder = _written_log(tmp_path, "[0, [[[], []], [1e-05")
    if broken == records.HASH:
        (folder / records.HASH).write_text('{"structural_hash": ')
    with pytest.raises(records.TuningLogError, match=rf"{folder / broken}: "):
        tune(CFG, llvm(), ["sigmoid_gate"], tmp_path, trials=0, echo=quiet)
    command = [*SHAPE_ARGS, "--ops", "sigmoid_gate", "--work-dir", str(tmp_path)]
    assert tune_main(command) == build_main([*command, "--out", str(tmp_path / "build")]) == 1
    err = capsys.readouterr().err
    assert err.count(f"error: {folder / broken}: ") == 2 and err.count(records.FORCE_HINT) == 2
    (result,) = tune(CFG, llvm(), ["sigmoid_gate"], tmp_path, trials=0, force=True, echo=quiet)
    assert result.status == "tuned" and result.note.startswith(f"replaced an unreadable log ({folder / broken}: ")
    assert records.lookup(tmp_path, w).record is not None


def test_a_log_of_an_earlier_definition_is_replaced_and_said(tuned_logs, tmp_path):
    """A log whose workload hash is of another definition (the op changed since it was tuned): `make build` names
    the file and says to re-tune; the tuner tunes afresh and says it replaced the log."""
    w = workload(OPS["sigmoid_gate"], CFG, "llvm")
    other = workload(OPS["partial_neox_rope"], CFG, "llvm")
    shutil.copytree(tuned_logs / other.key, tmp_path / w.key)
    with pytest.raises(records.MissingRecordError, match=f"{tmp_path / w.key / records.HASH} holds another"):
        records.lookup(tmp_path, w)
    (result,) = tune(CFG, llvm(), ["sigmoid_gate"], tmp_path, trials=0, echo=quiet)
    assert result.status == "tuned" and "replaced the log of an earlier definition of sigmoid_gate" in result.note
    assert records.lookup(tmp_path, w).record is not None


def test_foreign_log_is_an_error_naming_the_file(tmp_path):
    w, folder = _written_log(tmp_path, '[0, [[[], []], [1e-05], {"kind": "cuda", "arch": "sm_90"}, []]]')
    with pytest.raises(records.TuningLogError, match=f"{folder / records.RECORDS}.*foreign.*'cuda'"):
        records.lookup(tmp_path, w)


def test_knob_grid_designs_and_rejections(monkeypatch):
    """The grid adds one hand design per distinct combination; combinations the schedule rejects, or that give
    the defaults' program again, are counted."""
    w = workload(OPS["sigmoid_gate"], CFG, "cuda")
    monkeypatch.setitem(w.op.knobs, "cuda", {})
    assert knob_grid(w.op, "cuda") == [{}]  # no grid: the defaults only
    monkeypatch.setitem(w.op.knobs, "cuda", {"threads": (64, 0, 128), "vector": (2, 4)})
    assert len(knob_grid(w.op, "cuda")) == 7
    designs, dropped = hand_designs(w, tvm.s_tir.Schedule(w.mod))
    assert (len(designs), dropped) == (4, 3)  # threads=0 cannot split; 128 x 4 are the defaults


def test_graph_run_evaluator_rotates_argument_sets_and_times_per_launch():
    """The CUDA runner's evaluator (a fake graph here: no GPU): one capture of LAUNCHES launches rotating
    over the argument sets, replays calibrated to min_repeat_ms, seconds per launch."""
    calls = []

    class Graph:
        def __init__(self, run, device_id):
            assert device_id == 0
            run()
            self.replays = 0

        def replay(self):
            self.replays += 1

        def elapsed(self, replays):
            return replays * measure.LAUNCHES * 2e-6  # 2 us a launch

    class Module:
        entry_name = "main"

        def __getitem__(self, name):
            assert name == "main"
            return lambda *args: calls.append(args)

    class Device:
        index = 0

        def sync(self):
            pass

    sets = [("a0", "b0"), ("a1", "b1"), ("a2", "b2")]
    config = ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=10)
    costs = measure.graph_run_evaluator(Module(), Device(), config, sets, make_graph=Graph)
    assert calls == [sets[i % 3] for i in range(measure.LAUNCHES)] * 2  # eager warm-up, then the capture
    assert costs == pytest.approx([2e-6] * 3)


def test_alloc_arguments_fill_once_and_copy_into_distinct_sets():
    """Index buffers hold the given values; the random fill is drawn once and copied, each set in its own memory
    (the rotating sets must not alias, or a graph's launches would hit in L2); the sets are kept while the
    workload stays the same."""
    slots = np.array([1, 0], np.int32)
    info = [("TENSOR", "float32", (4, 8)), ("TENSOR", "int32", (2,))]
    sets = measure.alloc_arguments([None, slots], tvm.cpu(), info, 3)
    assert len(sets) == 3
    first = sets[0][0].numpy()
    assert np.isfinite(first).all() and first.std() > 0
    for data, index in sets:
        assert np.array_equal(data.numpy(), first) and np.array_equal(index.numpy(), slots)
    sets[1][0].copyfrom(np.zeros((4, 8), np.float32))
    assert np.array_equal(sets[0][0].numpy(), first) and np.array_equal(sets[2][0].numpy(), first)
    assert measure.alloc_arguments([None, slots], tvm.cpu(), info, 3) is sets  # kept for the workload's candidates
    other = measure.alloc_arguments([None, slots[::-1].copy()], tvm.cpu(), info, 3)
    assert other is not sets and np.array_equal(other[0][1].numpy(), slots[::-1])


def test_tuner_keeps_the_fastest_record_that_matches_the_reference(tuned_logs, tmp_path, monkeypatch):
    """Records are checked against the reference fastest first (MetaSchedule only times them): a faster record
    that fails is passed over and named in the note; when none matches, the workload is an error."""
    root = tmp_path / "logs"
    shutil.copytree(tuned_logs, root)
    verdicts = iter([["sigmoid_gate.out: 3 elements differ"], []])
    monkeypatch.setattr(driver, "check_kernel", lambda *args: next(verdicts))
    (result,) = tune(CFG, llvm(), ["sigmoid_gate"], root, trials=0, force=True, echo=quiet)
    assert result.note.endswith("1 faster record(s) rejected: sigmoid_gate.out: 3 elements differ")
    assert json.loads((root / result.key / records.SUMMARY).read_text())["best_us"] == result.best_us
    monkeypatch.setattr(driver, "check_kernel", lambda *args: ["sigmoid_gate.out: 1 elements differ"])
    with pytest.raises(RuntimeError, match="no record matches the reference"):
        tune(CFG, llvm(), ["sigmoid_gate"], root, trials=0, force=True, echo=quiet)


def test_replay_leaves_the_workload_untouched(tuned_logs):
    """A replayed trace must not rewrite the IR the workload (and the database's workload) holds."""
    w = workload(OPS["sigmoid_gate"], CFG, "llvm")
    before, general = w.mod.script(), w.general.script()
    found = records.lookup(tuned_logs, w)
    records.replay(found.record, w, found.folder)
    assert (w.mod.script(), w.general.script()) == (before, general)


def test_flop_bound_gemvs_get_the_deeper_search_by_default(tmp_path, monkeypatch):
    """GEMVs of >= 8 lanes search `deep` times the default trials; other ops, and an explicit --trials, do not."""
    asked = {}

    def search(self, w, db, trials, work_dir):
        asked[w.op.name] = trials
        return ""

    monkeypatch.setattr(driver._Tuner, "_search", search)
    monkeypatch.setitem(driver.BUDGETS, "llvm", dataclasses.replace(driver.BUDGETS["llvm"], trials=2, deep=3))
    cfg8 = CFG.replace(batch=8, slots=8)
    tune(cfg8, llvm(), ("gemv_in_proj_b", "sigmoid_gate"), tmp_path / "default", echo=quiet)
    assert asked == {"gemv_in_proj_b": 6, "sigmoid_gate": 2}
    tune(cfg8, llvm(), ("gemv_in_proj_b",), tmp_path / "explicit", trials=2, echo=quiet)
    assert asked["gemv_in_proj_b"] == 2
    assert not driver.flop_bound(OPS["gemv_in_proj_b"], CFG)


def test_build_names_ops_that_are_library_calls_only(tmp_path, capsys):
    """A CUDA build of library calls alone (cuBLAS GEMMs) would compile nothing: refused naming `--ops`."""
    argv = ["--target", "cuda", "--preset", "qwen3.5-0.8b", "--batch", "16", "--max-len", "64"]
    with pytest.raises(SystemExit) as exit_:
        build_main([*argv, "--ops", "gemm_lm_head", "--work-dir", str(tmp_path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "--ops: gemm_lm_head: library calls on cuda, nothing to compile" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["target folder", "build folder", "build link"])
def test_build_names_a_file_or_link_where_its_folder_goes(tmp_path, capsys, where):
    """Exit status 2 naming the path, nothing built or removed; a leftover of an interrupted build that is a file,
    not a folder, is cleared by the next build."""
    out = tmp_path / "out"
    final = out / naming.build(CFG, "llvm")
    path = final.parent if where == "target folder" else final
    path.parent.mkdir(parents=True)
    if where == "build link":
        (tmp_path / "elsewhere").mkdir()
        path.symlink_to(tmp_path / "elsewhere")
    else:
        path.write_text("kept")
    argv = [*SHAPE_ARGS, "--allow-hand", "--ops", "sigmoid_gate", "--work-dir", str(tmp_path), "--out", str(out)]
    with pytest.raises(SystemExit) as exit_:
        build_main(argv)
    kind = "link" if where == "build link" else "file"
    assert exit_.value.code == 2
    assert f"--out {out}: {path}: a {kind} where a build folder goes" in capsys.readouterr().err
    assert path.is_symlink() if kind == "link" else path.read_text() == "kept"
    path.unlink()
    final.parent.mkdir(parents=True, exist_ok=True)
    (final.parent / f".{final.name}.partial-0000-old").write_text("")  # a file an interrupted move left
    assert build_main(argv) == 0 and sorted(p.name for p in final.parent.iterdir()) == [final.name]
