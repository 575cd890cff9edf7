"""One op's kernel launched a few times on the op benchmark's inputs, for Nsight Compute: where its time goes.

ncu --clock-control none --section SpeedOfLight ... python -m benchmarks.profile --op decode_attention_split \
    [--batch 1] [--position P] [--max-len L] [--library build/bench/hand] [--launches 3] [--baseline fla]
(`benchmarks/h200.sh OUT "ncu:OP BATCH [POSITION [ARGS]]"` runs it under ncu). `--baseline fla` launches fla's kernel in
our state layout (`fla_ops.FlaStep`, the delta rule's same-run baseline) on the same inputs instead. Inputs as in
`benchmarks.run`: every lane active, every sequence at the last cache row unless `--position` says otherwise;
`--max-len` replaces the op benchmark's cache rows (a decode step's shape, e.g. 4096).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable

import numpy as np
import torch

from benchmarks import fla_ops
from benchmarks.configs import OP_PRESET, op_config
from benchmarks.run import inputs, kernels_for
from gdn_tvm import naming
from gdn_tvm.registry import OPS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=OP_PRESET)
    p.add_argument("--op", required=True, choices=sorted(OPS))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--position", type=int, help="every lane's position (default: the last cache row)")
    p.add_argument("--max-len", type=int, help="KV rows per slot (default: the op benchmark's for the batch)")
    p.add_argument("--library", help="build root of prebuilt CUDA modules (default: compile here)")
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--baseline", choices=["fla"], help="launch this baseline instead of our kernel (delta rule ops)")
    args = p.parse_args(argv)
    cfg = op_config(args.preset, args.batch)
    if args.max_len is not None:
        cfg = cfg.replace(max_len=args.max_len)
    if args.position is not None and not 0 <= args.position < cfg.max_len:
        p.error(f"--position {args.position} is outside the cache's {cfg.max_len} rows")
    op = OPS[args.op]
    if args.baseline and op.family != "delta_rule":
        p.error(f"--baseline {args.baseline} times the delta rule ops, not {args.op}")
    values = inputs(op, cfg, np.random.default_rng(0), position=args.position)
    launch: Callable[[], None]
    if args.baseline:
        launch = fla_ops.FlaStep(cfg, values, fused=bool(op.flags.get("fused", False)), v_first=True)
    else:
        launch = functools.partial(kernels_for(cfg, [args.op], args.library)[args.op].launch, values)
    for _ in range(args.launches):
        launch()
    torch.cuda.synchronize()
    who = f"{args.baseline} " if args.baseline else ""
    print(f"{who}{args.op} {naming.build(cfg, 'cuda')}: {args.launches} launches", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
