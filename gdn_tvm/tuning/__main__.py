"""`python -m gdn_tvm.tuning` (`make tune`): MetaSchedule-tune the workloads of a decode configuration for a target.

Defaults: the ops a decode step launches (`plan.step_ops`; `--ops all`: every registry op) of the bundled default
preset at batch 1; CUDA (sm_90) when a GPU is present, else llvm with this
machine's cores; `BUDGETS[kind].trials` candidates per workload (llvm 8, cuda 16; on CUDA 4x that for the
FLOP-bound GEMVs of 8 lanes or more, `driver.flop_bound`, unless `--trials` is given). Logs go to
`<work-dir>/<workload key>/`; workloads already recorded are skipped (`--force` tunes them further), and an
interrupted run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from gdn_tvm import naming
from gdn_tvm.cli import add_arguments, decode_config, folder, op_names
from gdn_tvm.registry import get, workload_groups
from gdn_tvm.target import by_name, gpu_present
from gdn_tvm.tuning.driver import BUDGETS, flop_bound, table, tune
from gdn_tvm.tuning.records import FORCE_HINT, TuningLogError


def _interrupted(_signum, _frame) -> None:
    """Ctrl-C: MetaSchedule's C++ search loop swallows KeyboardInterrupt, so leave at once. The databases are
    appended record by record, so nothing measured is lost; the next run resumes from them."""
    print("\ninterrupted: measured records are kept; run again to resume", file=sys.stderr, flush=True)
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gdn_tvm.tuning", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(p)
    p.add_argument(
        "--trials",
        type=int,
        help="MetaSchedule candidates per workload (default per target; 0 measures the hand schedule only)",
    )
    p.add_argument("--work-dir", default="tuning_logs", help="tuning log root (default: tuning_logs)")
    p.add_argument(
        "--force",
        action="store_true",
        help="tune recorded workloads again (keeps the best; an unreadable log is replaced)",
    )
    args = p.parse_args(argv)
    target = by_name(args.target)
    kind = target.kind.name
    if kind == "cuda" and not gpu_present():
        p.error("tuning for cuda measures on the GPU, and none is present")
    if args.trials is not None and args.trials < 0:
        p.error(f"--trials: expected 0 or more, got {args.trials}")
    folder(p, "--work-dir", args.work_dir)
    cfg = decode_config(p, args)
    names = op_names(p, args, cfg)
    budget = BUDGETS[kind]
    trials = budget.trials if args.trials is None else args.trials
    groups = workload_groups(cfg, kind, names).values()
    each = f"{trials} trials each"
    if args.trials is None and budget.deep > 1 and any(flop_bound(get(ops[0]), cfg) for ops in groups):
        each += f" ({trials * budget.deep} for the FLOP-bound GEMVs)"
    print(
        f"tuning {len(groups)} workloads ({len(names)} ops) of {naming.build(cfg, kind)}, {each}, "
        f"logs in {args.work_dir}/{kind}/",
        flush=True,
    )
    start = time.perf_counter()
    signal.signal(signal.SIGINT, _interrupted)
    try:
        results = tune(cfg, target, names, args.work_dir, trials, args.force, lambda s: print(s, flush=True))
    except TuningLogError as err:
        print(f"error: {err}\n({FORCE_HINT})", file=sys.stderr)
        return 1
    print(table(results))
    print(f"done in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
