"""Time an op's hand schedule over its knob grid (`KNOBS` of schedules/<op>.py) on the GPU.

python -m benchmarks.sweep --op delta_rule [delta_rule_fused ...] --batches 1 32 [--preset qwen3.5-4b]
    [--max-len L] [--split-len S] [--position P] [--knobs JSON ...] [--out-of-place] [--jobs N] [--out FILE]
    [--weight-dtype D] [--kv-dtype D] [--state-dtype D]
Prints one line per knob combination (median microseconds, GB/s) and appends the results as JSON lines stamped with
the commit measured (`benchmarks.record.commit`; to an `.xz` file as one more xz stream: the committed sweeps are
packed, `xzcat` reads them whole); it is how
the hand schedules' default knobs were chosen. `--max-len` / `--split-len` replace the op benchmark's cache rows
and split length (e.g. the split-KV kernel at B=1 over 4096 rows in splits of 32 instead of 128); `--position`
puts every sequence there instead of at the last row (a decode step's cache is partly filled); `--knobs
'{"lanes": 16}' ...` times those combinations instead of the grid; `--out-of-place` also times each design writing
its in-place state to a buffer of its own, as fla does (does the in-place update cost bandwidth?); `--jobs N`
compiles the designs in N processes first (a grid of 40 designs at 5 batches is minutes of compiling in one); the
storage dtypes are the op benchmark's (a row names those that are not float32).
"""

from __future__ import annotations

import argparse
import json
import lzma
import multiprocessing
import sys
import tempfile
from concurrent.futures import Executor, ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
import tvm

from benchmarks.configs import op_config
from benchmarks.record import commit
from benchmarks.run import GPU, check, clone, expected, input_sets, time_kernel
from benchmarks.timing import gbps, time_graph
from gdn_tvm.cli import add_dtype_arguments, dtypes
from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.codegen.library import export_library
from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.signature import Arg
from gdn_tvm.target import cuda, device_of
from gdn_tvm.traffic import rotating_sets, traffic
from gdn_tvm.tuning.space import knob_grid


def sweep(
    name: str,
    preset: str,
    batch: int,
    rng: np.random.Generator,
    position: int | None = None,
    pool: Executor | None = None,
    combos: list[dict] | None = None,
    out_of_place: bool = False,
    stored: dict[str, str] | None = None,
    **shape,
) -> list[dict]:
    """Every knob-grid design of `name` (or the knob combinations `combos`) at the op benchmark's shape for `batch`
    and storage dtypes `stored` (by `DecodeConfig` field; default its defaults), with `shape` (max_len, split_len)
    replaced where given, every sequence at `position` (default: the last row); compiled by `pool` where given;
    `out_of_place`: also timed with each in-place state written to a buffer of its own (`out_of_place_us`), as fla
    writes its final state."""
    op, stored = OPS[name], stored or {}
    cfg = op_config(preset, batch, **stored).replace(**{k: v for k, v in shape.items() if v is not None})
    named = {field: dtype for field, dtype in stored.items() if dtype != "float32"}
    if position is not None and not 0 <= position < cfg.max_len:
        raise ValueError(f"position {position} is outside the cache's {cfg.max_len} rows")
    nbytes = traffic(op, cfg)
    sets = rotating_sets(nbytes, GPU)
    value_sets = input_sets(op, cfg, rng, sets, position=position)
    expect, pristine = expected(op, cfg, value_sets[0]), clone(value_sets[0])
    rows = []
    for combo, kernel in designs(name, cfg, pool, combos):
        if isinstance(kernel, str):
            print(f"{name} B={batch} {combo}: rejected ({kernel})", flush=True)
            continue
        copy = clone(pristine)
        try:
            kernel.launch(copy)
        except Exception as e:  # noqa: BLE001 - a design the GPU refuses to run: recorded like a wrong one
            error = f"failed: {type(e).__name__}: {e}"[:300]
        else:
            err, why = check(op, cfg, copy, expect)
            error = why and f"wrong: {why}"
        if error:  # a failing or wrong design is recorded, never timed, and fails the run (`main`)
            rows.append(
                {"op": name, "preset": preset, "batch": batch, **named, "knobs": combo or "defaults", "error": error}
            )
            print(json.dumps(rows[-1]), flush=True)
            continue
        us = time_kernel(kernel, value_sets)
        rows.append({"op": name, "preset": preset, "batch": batch, **named, "max_len": cfg.max_len,
                     "split_len": cfg.split_len,
                     "position": cfg.max_len - 1 if position is None else position,
                     "knobs": combo or "defaults", "us": round(us, 3), "rel_err": float(f"{err:.3g}")})  # fmt: skip
        if out_of_place:
            rows[-1]["out_of_place_us"] = round(time_apart(kernel, value_sets), 3)
        if position is None:  # the traffic model counts every cache row: GB/s only where all are read
            rows[-1]["gbps"] = round(gbps(nbytes, us), 1)
        print(json.dumps(rows[-1]), flush=True)
    return rows


def time_apart(kernel: Kernel, value_sets: list[dict]) -> float:
    """Median graph-replayed microseconds of `kernel` bound by `bind_apart`: the same reads and writes, the writes
    to other addresses."""
    bound = [bind_apart(kernel.signature, values) for values in value_sets]
    return time_graph(lambda i: kernel.func(*bound[i]), len(bound))


def bind_apart(signature: list[Arg], values: dict) -> list:
    """`bind`, with every aliased (in-place) output bound to a fresh buffer instead of its state."""
    return [torch.empty_like(values[a.alias]) if a.alias else values[a.name] for a in signature]


def designs(
    name: str, cfg: DecodeConfig, pool: Executor | None, combos: list[dict] | None = None
) -> list[tuple[dict, Kernel | str]]:
    """Each knob combination of `name`'s grid (or of `combos`) with its kernel, or why it was rejected (the schedule
    or codegen refused it for this shape); compiled here, or by `pool` into libraries loaded here."""
    op, combos = OPS[name], knob_grid(OPS[name], "cuda") if combos is None else combos
    if pool is None:
        return [(combo, _compiled(lambda c=combo: compile_op(op, cfg, cuda(), **c))) for combo in combos]
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / f"design{i}.so" for i in range(len(combos))]
        errors = list(pool.map(_export, [name] * len(combos), [cfg] * len(combos), combos, paths))
        device = device_of(cuda())
        return [
            (combo, error or _compiled(lambda p=path: Kernel(
                name, tvm.runtime.load_module(str(p))["main"], op.signature(cfg),
                (device.dlpack_device_type(), device.index))))
            for combo, path, error in zip(combos, paths, errors, strict=True)
        ]  # fmt: skip


def _compiled(make) -> Kernel | str:
    try:
        return make()
    except Exception as e:  # noqa: BLE001 - a combination the schedule or codegen rejects for this shape
        return type(e).__name__


def _export(name: str, cfg: DecodeConfig, combo: dict, path: Path) -> str | None:
    """(In a worker process.) The design compiled into the library `path`, or why it was rejected."""
    try:
        export_library(tvm.IRModule({"main": OPS[name].schedule(cfg, "cuda", **combo).mod["main"]}), cuda(), path)
    except Exception as e:  # noqa: BLE001 - a combination the schedule or codegen rejects for this shape
        return type(e).__name__
    return None


def append_rows(path: str, rows: list[dict]) -> None:
    """`rows` appended to the JSON-lines file `path`; to an `.xz` one as one more xz stream (read whole by `xzcat`
    and `lzma.decompress`)."""
    with lzma.open(path, "at") if path.endswith(".xz") else Path(path).open("a") as f:
        f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", nargs="+", required=True, help="one or more ops, swept in turn")
    p.add_argument("--preset", default="qwen3.5-4b")
    p.add_argument("--batches", type=int, nargs="+", default=[1])
    p.add_argument("--max-len", type=int, help="KV rows per slot (default: the op benchmark's for the batch)")
    p.add_argument("--split-len", type=int, help="positions per split-KV chunk (default: the config's)")
    p.add_argument("--position", type=int, help="every sequence's position (default: the last cache row)")
    p.add_argument("--knobs", nargs="+", type=json.loads, help="knob combinations (JSON objects) instead of the grid")
    p.add_argument("--out-of-place", action="store_true", help="also time states written to buffers of their own")
    p.add_argument("--jobs", type=int, default=1, help="processes compiling the designs (default: compile here)")
    p.add_argument("--out", default="benchmarks/results/h200_sweeps.jsonl.xz")
    add_dtype_arguments(p)
    args = p.parse_args(argv)
    rng = np.random.default_rng()  # fresh inputs each run
    shape = {"max_len": args.max_len, "split_len": args.split_len}
    spawn = multiprocessing.get_context("spawn")  # not fork: this process holds a CUDA context
    pool = ProcessPoolExecutor(args.jobs, mp_context=spawn) if args.jobs > 1 else None
    rows = []
    for name in args.op:
        for batch in args.batches:  # each shape's rows kept as it ends: a run stopped early keeps what it timed
            done = sweep(
                name, args.preset, batch, rng, args.position, pool, args.knobs, args.out_of_place, dtypes(args), **shape
            )
            append_rows(args.out, [{"commit": commit(), **row} for row in done])
            rows += done
    if pool is not None:
        pool.shutdown()
    timed = [r for r in rows if "us" in r]
    for batch in sorted({r["batch"] for r in timed}):
        print(f"best at B={batch}: {min((r for r in timed if r['batch'] == batch), key=lambda r: r['us'])}")
    return 1 if len(timed) < len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
