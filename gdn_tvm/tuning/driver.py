"""The tuning loop behind `make tune`: every distinct workload of the registry, one line per workload as it
finishes, a table at the end.

Per workload: measure the hand schedule (default knobs) and commit it to the database first, so the result is
never slower than the hand schedule; then every other combination of its knob grid; then MetaSchedule over the
default rules (`space.design_space`) with the xgboost cost model, seeded from the best of those records; then
check the fastest records against the reference on the device, fastest first, and prune the database to the
first that matches.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tvm
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms

from gdn_tvm.codegen.compile import compile_func
from gdn_tvm.codegen.library import cuda_compiler
from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import Op, get, workload_groups
from gdn_tvm.schedules.gemv import MANY_LANES
from gdn_tvm.signature import DEVICE_NAMES
from gdn_tvm.target import device_of, gpu_spec
from gdn_tvm.traffic import rotating_sets, traffic
from gdn_tvm.tuning import measure, records
from gdn_tvm.tuning.space import design_space, first_line, hand_designs
from gdn_tvm.tuning.workload import Workload, workload
from gdn_tvm.verify import check_kernel


@dataclass(frozen=True)
class Budget:
    """Search settings per target kind; `trials` is the default number of MetaSchedule candidates measured
    per workload (the hand designs of the knob grid are measured on top); `graph`: time CUDA-graph replays
    (`measure.graph_run_evaluator`), not eager calls, rotating over as many argument sets as the op benchmark
    (`traffic.rotating_sets`: the launches read from DRAM, not L2), so tuned and hand compare as it times them."""

    trials: int
    per_iter: int
    population: int
    evaluator: ms.runner.EvaluatorConfig
    graph: bool = False
    deep: int = 1  # times `trials` for FLOP-bound workloads (`flop_bound`), by default


def flop_bound(op: Op, cfg: DecodeConfig) -> bool:
    """GEMVs of 8 lanes or more: each weight element feeds B multiply-adds, so float32 FLOPs bound them (the best
    hand designs reach 25 of the H200's 67 TFLOP/s at B=32); a register-tiled matmul is what could pass that, and
    16 search candidates never found one that beat the knob grid."""
    return op.family == "gemv" and cfg.batch >= MANY_LANES


BUDGETS = {
    # 2-core CPU: the 28 workloads of the default preset x (the knob grid + 8 candidates) in about two minutes.
    "llvm": Budget(8, 8, 64, ms.runner.EvaluatorConfig(number=10, repeat=3, min_repeat_ms=5)),
    # H200: the knob grid plus one search round of 16 candidates per workload, built in parallel, measured in
    # turn: 3-82 s a workload graph-timed, 4-6.5 minutes a preset before the fused GEMVs and 1-2 more with them (one
    # preset per GPU; benchmarks/results/h200_tune.log). --trials: deeper.
    "cuda": Budget(16, 16, 256, ms.runner.EvaluatorConfig(number=1, repeat=3, min_repeat_ms=10), graph=True, deep=4),
}


@dataclass(frozen=True)
class Result:
    """How one workload ended: `status` is "tuned" or "cached" (recorded by an earlier run)."""

    key: str
    ops: tuple[str, ...]
    status: str
    trials: int
    best_us: float
    hand_us: float
    designs: str  # hand designs kept / knob combinations
    note: str  # e.g. that MetaSchedule's default rules rejected the workload
    seconds: float = 0.0

    @property
    def speedup(self) -> float:
        return self.hand_us / self.best_us

    def line(self) -> str:
        note = f", {self.note}" if self.note else ""
        return (
            f"{self.key} [{', '.join(self.ops)}]: {self.status}, {self.trials} trials, hand designs {self.designs}"
            f"{note}, best {self.best_us:.2f} us vs hand {self.hand_us:.2f} us ({self.speedup:.2f}x)"
            f" in {self.seconds:.0f} s"
        )


def workloads(cfg: DecodeConfig, kind: str, names: Sequence[str]) -> list[tuple[Workload, tuple[str, ...]]]:
    """The distinct workloads of `names` (deduplicated by workload key), each with the op names sharing it."""
    return [(workload(get(ops[0]), cfg, kind), tuple(ops)) for ops in workload_groups(cfg, kind, names).values()]


def tune(
    cfg: DecodeConfig,
    target: tvm.target.Target,
    names: Sequence[str],
    root: str | Path,
    trials: int | None = None,
    force: bool = False,
    echo: Callable[[str], None] = print,
) -> list[Result]:
    """Tune every distinct workload of `names` into `<root>/<workload key>/`; returns one result per workload."""
    budget = BUDGETS[target.kind.name]
    if trials is None:
        tuner = _Tuner(target, budget, Path(root), budget.trials, budget.deep, force)
    else:
        tuner = _Tuner(target, budget, Path(root), trials, 1, force)
    results = []
    for w, ops in workloads(cfg, target.kind.name, names):
        start = time.perf_counter()
        result = dataclasses.replace(tuner.run(w, ops), seconds=time.perf_counter() - start)
        echo(result.line())
        results.append(result)
    return results


class _Tuner:
    """One tuning session: the target, its budget, and a builder shared by every workload."""

    def __init__(self, target: tvm.target.Target, budget: Budget, root: Path, trials: int, deep: int, force: bool):
        self.target, self.budget, self.root, self.force = target, budget, root, force
        self.trials, self.deep = trials, deep
        self.cores = int((target.host or target).attrs["num-cores"])
        self.builder = measure.PoolBuilder(self.cores)
        # One runner (one worker process) for the session; `run` points its argument sets at the workload.
        self.runner = ms.runner.LocalRunner(
            evaluator_config=budget.evaluator,
            f_run_evaluator=measure.graph_run_evaluator if budget.graph else None,
        )

    def run(self, w: Workload, ops: tuple[str, ...]) -> Result:
        """Tune `w` (or report its record); resumes from the scratch database an interrupted run left."""
        path = records.folder(self.root, w)
        scratch = path / records.SCRATCH
        stale, current = "", True
        if records.has_log(path):
            try:
                current = records.best(records.open_db(path, w), w) is not None
            except records.TuningLogError as err:  # with --force, tuned afresh
                if not self.force:
                    raise
                current, stale = False, f"replaced an unreadable log ({err})"
        if not current:
            stale = stale or f"replaced the log of an earlier definition of {w.op.name}"  # the op changed since
            records.drop(path)
            if scratch.exists() and records.best(records.open_scratch(scratch, w.kind), w) is None:
                shutil.rmtree(scratch)
        resuming = scratch.exists()
        if records.has_log(path):
            if not (self.force or resuming):
                s = records.read_summary(path)
                return Result(
                    w.key, ops, "cached", s["trials"], s["best_us"], s["hand_us"], s["hand_designs"], s["note"]
                )
            else:
                records.seed_scratch(path, w)
        scratch.mkdir(parents=True, exist_ok=True)
        db = records.open_scratch(scratch, w.kind)
        prior = len(db)  # what an interrupted run recorded: its hand record, the knob grid, search candidates
        self.runner.f_alloc_argument = functools.partial(measure.alloc_arguments, w.index_values)
        self.runner.alloc_repeat = (
            rotating_sets(traffic(w.op, w.cfg), gpu_spec(self.target)) if self.budget.graph else 1
        )
        designs, dropped = hand_designs(w, s_tir.Schedule(w.mod))  # [0]: the defaults, i.e. the hand schedule
        searched = prior - len(designs)
        trials = self.trials * (self.deep if flop_bound(w.op, w.cfg) else 1)
        fresh = trials and searched < 0  # a fresh run, or one cut inside the grid: measure the grid too
        hand_secs, *_ = self._measure(w, designs if fresh else designs[:1], db)
        if isinstance(hand_secs, str):
            raise RuntimeError(f"{w.op.name}: the hand schedule fails to build or run on {w.kind}:\n{hand_secs}")
        note = self._search(w, db, trials - max(searched, 0), str(scratch)) if trials else ""
        chosen, rejected = self._verified(w, db)
        rejection = f"{len(rejected)} faster record(s) rejected: {rejected[0]}" if rejected else ""
        note = "; ".join(filter(None, [stale, note, rejection]))
        result = Result(
            w.key,
            ops,
            "tuned",
            len(db) - 1,  # every candidate measured, without this run's hand record
            records.mean_us(chosen),
            sum(hand_secs) / len(hand_secs) * 1e6,
            f"{len(designs)}/{len(designs) + dropped}",
            note,
        )
        summary = {
            "ops": list(ops),
            "trials": result.trials,
            "best_us": result.best_us,
            "hand_us": result.hand_us,
            "hand_designs": result.designs,
            "timing": "cuda-graph" if self.budget.graph else "eager",
            "note": note,
        }
        if w.kind == "cuda":  # the same record compiles to other kernels by release (docs/design.md)
            summary["compiler"] = cuda_compiler()
        records.prune(path, w, chosen)
        records.write_summary(path, summary)
        shutil.rmtree(scratch)
        return result

    def _verified(self, w: Workload, db) -> tuple[ms.database.TuningRecord, list[str]]:
        """The fastest record whose build (as `make build` replays it) matches the reference on this machine's
        device, and why each faster one did not: MetaSchedule times candidates without checking them."""
        rng = np.random.default_rng()
        rejected: list[str] = []
        for record in db.get_top_k(db.commit_workload(w.mod), len(db)):
            sch = records.replay(record, w, records.folder(self.root, w))
            failed = check_kernel(w.op, w.cfg, compile_func(w.op, w.cfg, sch.mod["main"], self.target), rng)
            if not failed:
                return record, rejected
            rejected.append("; ".join(failed))
        raise RuntimeError(f"{w.key}: no record matches the reference, the hand schedule's neither: {rejected[-1]}")

    def _search(self, w: Workload, db, trials: int, work_dir: str) -> str:
        """MetaSchedule over what it can search, `trials` candidates; returns a note on what was left out. A
        search that fails outright keeps what was measured (at least the hand designs) and says why."""
        space = design_space(w, self.target)
        if space.generator is None or trials <= 0:
            return space.note
        try:
            self._tune_tir(w, space.generator, db, trials, work_dir)
        except (RuntimeError, ValueError) as err:  # TVM check failures surface as either
            return "; ".join(filter(None, [space.note, f"the search failed ({first_line(err)})"]))
        return space.note

    def _measure(self, w: Workload, schedules: list[s_tir.Schedule], db) -> list[list[float] | str]:
        """Build and run schedules with MetaSchedule's builder and runner and commit a record for each that
        runs; per schedule its run seconds or its error message."""
        built = self.builder.build([ms.builder.BuilderInput(sch.mod, self.target) for sch in schedules])
        device = DEVICE_NAMES[device_of(self.target).dlpack_device_type()]
        args_info = ms.arg_info.ArgInfo.from_prim_func(w.mod["main"])
        ok = [i for i, b in enumerate(built) if not b.error_msg]
        futures = self.runner.run([ms.runner.RunnerInput(built[i].artifact_path, device, args_info) for i in ok])
        out: list[list[float] | str] = [b.error_msg for b in built]
        for i, future in zip(ok, futures, strict=True):
            shutil.rmtree(Path(built[i].artifact_path).parent, ignore_errors=True)
            result = future.result()
            if result.error_msg:
                out[i] = result.error_msg
                continue
            out[i] = [float(s) for s in result.run_secs]
            record = ms.database.TuningRecord(
                schedules[i].trace, db.commit_workload(w.mod), out[i], self.target, args_info
            )
            db.commit_tuning_record(record)
        return out

    def _tune_tir(self, w: Workload, space, db, trials: int, work_dir: str) -> None:
        """`tune_tir` on the scratch database; MetaSchedule's own logs go to `work_dir/logs`."""
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)  # not on the console
        population = self.budget.population
        ms.tune_tir(
            w.mod,
            self.target,
            work_dir,
            trials,
            num_trials_per_iter=min(trials, self.budget.per_iter),
            space=space,
            strategy=ms.search_strategy.EvolutionarySearch(
                population_size=population, init_min_unmeasured=population // 4
            ),
            builder=self.builder,
            runner=self.runner,
            database=db,
            cost_model="xgb",
            task_scheduler="round-robin",
            num_tuning_cores=self.cores,
            seed=0,
        )


def table(results: Sequence[Result]) -> str:
    """The final summary: one row per workload and the totals."""
    rows = [("workload", "ops", "status", "trials", "hand us", "best us", "speedup")]
    rows += [
        (r.key, ",".join(r.ops), r.status, str(r.trials), f"{r.hand_us:.2f}", f"{r.best_us:.2f}", f"{r.speedup:.2f}x")
        for r in results
    ]
    hand, tuned = sum(r.hand_us for r in results), sum(r.best_us for r in results)
    rows.append(
        ("total", "", "", str(sum(r.trials for r in results)), f"{hand:.2f}", f"{tuned:.2f}", f"{hand / tuned:.2f}x")
    )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(wd) for c, wd in zip(row, widths, strict=True)) for row in rows)
