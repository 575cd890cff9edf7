"""Time an op's hand schedule over its knob grid (`KNOBS` of schedules/<op>.py) on the GPU.

python -m benchmarks.sweep --op delta_rule --batches 1 32 [--preset qwen3.5-4b] [--out FILE]
Prints one line per knob combination (median microseconds, GB/s) and appends the results as JSON; it is how
the hand schedules' default knobs were chosen.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.configs import op_config
from benchmarks.run import input_sets, time_kernel
from benchmarks.timing import gbps
from gdn_tvm.build.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.target import cuda
from gdn_tvm.traffic import rotating_sets, traffic
from gdn_tvm.tuning.space import knob_grid


def sweep(name: str, preset: str, batch: int, rng: np.random.Generator) -> list[dict]:
    op = OPS[name]
    cfg = op_config(preset, batch)
    nbytes = traffic(op, cfg)
    sets = rotating_sets(nbytes)
    value_sets = input_sets(op, cfg, rng, sets)
    rows = []
    for combo in knob_grid(op, "cuda"):
        try:
            kernel = compile_op(op, cfg, cuda(), **combo)
        except Exception as e:  # noqa: BLE001 - a combination the schedule or codegen rejects for this shape
            print(f"{name} B={batch} {combo}: rejected ({type(e).__name__})", flush=True)
            continue
        us = time_kernel(kernel, value_sets)
        rows.append({"op": name, "batch": batch, "knobs": combo or "defaults", "us": round(us, 3),
                     "gbps": round(gbps(nbytes, us), 1)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", required=True)
    p.add_argument("--preset", default="qwen3.5-4b")
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--out", default="benchmarks/results/h200_sweeps.jsonl")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = [r for batch in args.batches for r in sweep(args.op, args.preset, batch, rng)]
    with Path(args.out).open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    best = min(rows, key=lambda r: (r["batch"], r["us"]))
    print(f"best at B={best['batch']}: {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
