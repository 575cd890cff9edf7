"""`python -m gdn_tvm.export` (`make build`): build one decode configuration and target from the tuning logs: the ops a
decode step launches (`plan.step_ops`), or those `--ops` names (`all`: every registry op)."""

from __future__ import annotations

import argparse
import sys
import time

from gdn_tvm.cli import add_arguments, decode_config, folder, op_names
from gdn_tvm.export.artifact import build
from gdn_tvm.registry import get
from gdn_tvm.target import by_name
from gdn_tvm.tuning.records import FORCE_HINT, MissingRecordError, TuningLogError


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gdn_tvm.export", description=__doc__)
    add_arguments(p)
    p.add_argument("--work-dir", default="tuning_logs", help="tuning log root (default: tuning_logs)")
    p.add_argument("--out", default="build", help="build root (default: build)")
    p.add_argument("--allow-hand", action="store_true", help="build workloads without a record by hand schedule")
    args = p.parse_args(argv)
    start = time.perf_counter()
    cfg = decode_config(p, args)
    logs, out = folder(p, "--work-dir", args.work_dir, write=False), folder(p, "--out", args.out)
    target, names = by_name(args.target), op_names(p, args, cfg)
    if not any(get(name).compiled(target.kind.name) for name in names):
        p.error(f"--ops: {', '.join(names)}: library calls on {target.kind.name}, nothing to compile")
    try:
        path = build(cfg, target, logs, out, args.allow_hand, names)
    except OSError as err:  # a file or link where a build folder goes, a folder that cannot be written
        p.error(f"--out {args.out}: {err}")
    except MissingRecordError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except TuningLogError as err:
        print(f"error: {err}\n({FORCE_HINT})", file=sys.stderr)
        return 1
    print(f"wrote {path} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
