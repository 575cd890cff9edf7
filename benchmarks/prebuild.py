"""Prebuild the CUDA modules the GPU benchmarks load, on any machine with the CUDA headers (the
pinned NVRTC compiles through a stub driver: no GPU needed).

python -m benchmarks.prebuild [--out build/bench] [--weight-dtype D] [--kv-dtype D] [--state-dtype D]
    [--model [--cases PRESET:BATCH ...] [--library-lanes N]]
One module per benchmark config under `<out>/hand/` (hand schedules only), under `<out>/tuned/` for the
configs with records in the tuning logs (the manifest names the workloads without one, built with the hand
schedule; none for a config without any log), and under `<out>/dlight/` the op
benchmark's dlight baselines. The op benchmark's configs are built at the storage dtypes given (pass the same flags
to `benchmarks.run`; a build's name holds them), the step benchmark's at the default dtypes only (it runs no other).
Carry the folder to the GPU machine and pass `--library <out>/hand` (and `--tuned <out>/tuned`, `--dlight-library
<out>/dlight`) to `benchmarks.run` / `benchmarks.steps`: no compile time there. `--model`: only the whole-model
benchmark's builds (tuned where records exist), under `<out>/model/` for `benchmarks.model --library <out>/model`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from benchmarks.configs import (
    DELTA_BATCHES,
    MODEL_CASES,
    OP_BATCHES,
    OP_PRESET,
    STEP_BATCHES,
    STEP_PRESETS,
    model_config,
    op_config,
    set_library_lanes,
    step_config,
)
from gdn_tvm import naming
from gdn_tvm.cli import add_dtype_arguments, dtypes
from gdn_tvm.config import DTYPE_FIELDS, DecodeConfig
from gdn_tvm.export.artifact import build
from gdn_tvm.plan import model_ops, step_ops
from gdn_tvm.registry import OPS, workload_groups
from gdn_tvm.target import cuda
from gdn_tvm.tuning import records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="build/bench")
    p.add_argument("--work-dir", default="tuning_logs", help="tuning logs (tuned records are used where present)")
    p.add_argument("--model", action="store_true", help="only the whole-model benchmark's builds, under OUT/model")
    p.add_argument("--cases", nargs="+", default=MODEL_CASES, help="with --model: these PRESET:BATCH cases")
    p.add_argument("--library-lanes", type=int, help="with --model: library GEMMs from N lanes (a crossover sweep)")
    add_dtype_arguments(p)
    args = p.parse_args(argv)
    if args.model:
        set_library_lanes(args.library_lanes)
        for case in args.cases:
            name, batch = case.split(":")
            cfg = model_config(name, int(batch))
            build(cfg, cuda(), args.work_dir, f"{args.out}/model", allow_hand=True, names=model_ops(cfg))
        return 0
    stored = dtypes(args)
    steps = [(cfg, step_ops(cfg)) for cfg in (step_config(p, b) for p in STEP_PRESETS for b in STEP_BATCHES)]
    if stored != {field: getattr(DecodeConfig, field) for field in DTYPE_FIELDS}:
        print("no step modules: benchmarks.steps runs at the default storage dtypes only", flush=True)
        steps = []
    wanted: dict[str, tuple] = {}  # one module per config, holding every op any benchmark needs of it
    for cfg, names in (
        [(op_config(OP_PRESET, b, **stored), list(OPS)) for b in OP_BATCHES]
        + [(op_config(OP_PRESET, b, **stored), ["delta_rule", "delta_rule_fused"]) for b in DELTA_BATCHES]
        + steps
    ):
        _, have = wanted.setdefault(naming.build(cfg, "cuda"), (cfg, []))
        have.extend(n for n in names if n not in have)
    with tempfile.TemporaryDirectory() as no_logs:
        for cfg, names in wanted.values():
            build(cfg, cuda(), no_logs, f"{args.out}/hand", allow_hand=True, names=names)
    for batch in OP_BATCHES:
        build(op_config(OP_PRESET, batch, **stored), cuda(), "", f"{args.out}/dlight", names=list(OPS), dlight=True)
    for cfg, names in wanted.values():
        if any(records.has_log(Path(args.work_dir) / key) for key in workload_groups(cfg, "cuda", names)):
            build(cfg, cuda(), args.work_dir, f"{args.out}/tuned", allow_hand=True, names=names)
        else:
            print(f"no tuned build of {naming.build(cfg, 'cuda')}: no tuning log", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
