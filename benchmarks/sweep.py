"""Time an op's hand schedule over its knob grid (`KNOBS` of schedules/<op>.py) on the GPU.

python -m benchmarks.sweep --op delta_rule --batches 1 32 [--preset qwen3.5-4b] [--max-len L] [--split-len S]
    [--position P] [--out FILE]
Prints one line per knob combination (median microseconds, GB/s) and appends the results as JSON; it is how
the hand schedules' default knobs were chosen. `--max-len` / `--split-len` replace the op benchmark's cache rows
and split length (e.g. the split-KV kernel at B=1 over 4096 rows in splits of 32 instead of 128); `--position`
puts every sequence there instead of at the last row (a decode step's cache is partly filled).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.configs import op_config
from benchmarks.run import GPU, input_sets, time_kernel
from benchmarks.timing import gbps
from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.target import cuda
from gdn_tvm.traffic import rotating_sets, traffic
from gdn_tvm.tuning.space import knob_grid


def sweep(
    name: str, preset: str, batch: int, rng: np.random.Generator, position: int | None = None, **shape
) -> list[dict]:
    """Every knob-grid design of `name` at the op benchmark's shape for `batch`, with `shape` (max_len, split_len)
    replaced where given, every sequence at `position` (default: the last row)."""
    op = OPS[name]
    cfg = op_config(preset, batch).replace(**{k: v for k, v in shape.items() if v is not None})
    if position is not None and not 0 <= position < cfg.max_len:
        raise ValueError(f"position {position} is outside the cache's {cfg.max_len} rows")
    nbytes = traffic(op, cfg)
    sets = rotating_sets(nbytes, GPU)
    value_sets = input_sets(op, cfg, rng, sets, position=position)
    rows = []
    for combo in knob_grid(op, "cuda"):
        try:
            kernel = compile_op(op, cfg, cuda(), **combo)
        except Exception as e:  # noqa: BLE001 - a combination the schedule or codegen rejects for this shape
            print(f"{name} B={batch} {combo}: rejected ({type(e).__name__})", flush=True)
            continue
        us = time_kernel(kernel, value_sets)
        rows.append({"op": name, "batch": batch, "max_len": cfg.max_len, "split_len": cfg.split_len,
                     "position": cfg.max_len - 1 if position is None else position,
                     "knobs": combo or "defaults", "us": round(us, 3)})  # fmt: skip
        if position is None:  # the traffic model counts every cache row: GB/s only where all are read
            rows[-1]["gbps"] = round(gbps(nbytes, us), 1)
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", required=True)
    p.add_argument("--preset", default="qwen3.5-4b")
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--max-len", type=int, help="KV rows per slot (default: the op benchmark's for the batch)")
    p.add_argument("--split-len", type=int, help="positions per split-KV chunk (default: the config's)")
    p.add_argument("--position", type=int, help="every sequence's position (default: the last cache row)")
    p.add_argument("--out", default="benchmarks/results/h200_sweeps.jsonl")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    shape = {"max_len": args.max_len, "split_len": args.split_len}
    rows = [r for batch in args.batches for r in sweep(args.op, args.preset, batch, rng, args.position, **shape)]
    with Path(args.out).open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    best = min(rows, key=lambda r: (r["batch"], r["us"]))
    print(f"best at B={best['batch']}: {best}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
