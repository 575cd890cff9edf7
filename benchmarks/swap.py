"""Where a kernel's time differs between the step and the op benchmark: one launch of a step's plan timed on the
step's own buffers, then with one argument at a time (and then all) swapped for the op benchmark's random inputs,
and (`--compile-modes`) with the plan's kernel swapped for the op's hand schedule compiled here by each compiler.

python -m benchmarks.swap --op decode_attention_split [--preset qwen3.5-4b] [--batch 32] [--decode 2048]
    [--library build/bench/hand] [--tuned build/bench/tuned] [--compile-modes nvrtc nvcc] [--out FILE]
The stack (the op's layer alone) decodes positions 0..decode-1 first, as `benchmarks.steps` does; every timing is
at position `decode`, graph-replayed as in the step benchmark's kernel breakdown. One JSON line per timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import tvm
import tvm_ffi

from benchmarks.configs import STEP_MAX_LEN, step_config
from benchmarks.run import inputs, kernels_for, library_kernels
from benchmarks.steps import decode_until
from benchmarks.timing import time_launch
from gdn_tvm import naming
from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import step_ops
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.signature import visible
from gdn_tvm.target import cuda


def benchmark_inputs(op: str, cfg: DecodeConfig, position: int, device: str = "cuda") -> dict:
    """The op benchmark's random inputs (`benchmarks.run.inputs`, every lane at `position`) as TVM tensors: a torch
    argument would send the launch to torch's stream, outside the runtime's capture."""
    values = inputs(OPS[op], cfg, np.random.default_rng(1), device=device, position=position)
    return {n: tvm_ffi.from_dlpack(v) for n, v in values.items()}


def swapped_calls(stack: HybridStack, op: str, bench: dict) -> list[tuple[str | None, object, list]]:
    """(label, function, arguments) of `op`'s launch in `stack`'s plan: as planned (label None), with each
    argument in turn replaced by `bench`'s value of it (label: its name), and with all replaced ("all").
    `bench` holds every visible argument of the op by name (`benchmarks.run.inputs`)."""
    layer = next(layer for layer in stack.layers if op in layer.launched)
    func, planned = layer.launches[layer.launched.index(op)]
    signature = OPS[op].signature(stack.cfg)
    names = [a.alias or a.name for a in signature]  # an alias write side takes its state's value
    labels = [None, *(a.name for a in visible(signature)), "all"]
    return [
        (label, func, [bench[n] if label in (n, "all") else v for n, v in zip(names, planned, strict=True)])
        for label in labels
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--op", required=True, choices=sorted(OPS))
    p.add_argument("--preset", default="qwen3.5-4b")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--decode", type=int, default=STEP_MAX_LEN // 2, help="positions decoded before the timing")
    p.add_argument("--library", help="build root of prebuilt hand modules (default: compile here)")
    p.add_argument("--tuned", help="build root of tuned modules, used where it holds this config")
    p.add_argument(
        "--compile-modes",
        nargs="*",
        default=[],
        choices=["nvrtc", "nvcc"],
        help="also time the op's hand schedule compiled here with these TVM_CUDA_COMPILE_MODEs",
    )
    p.add_argument("--out", help="also append the JSON lines to this file")
    args = p.parse_args(argv)  # fmt: skip
    cfg = step_config(args.preset, args.batch)
    if not 0 <= args.decode < cfg.max_len:
        p.error(f"--decode {args.decode} is outside the cache's {cfg.max_len} rows")
    kinds = [k for k in ("gdn", "attention") if args.op in step_ops(cfg, (k,))]
    if not kinds:
        launches = ", ".join(step_ops(cfg))
        p.error(f"--op {args.op} is not launched by a {naming.build(cfg, 'cuda')} step (its launches: {launches})")
    kernels = library_kernels(args.tuned, cfg) or kernels_for(cfg, step_ops(cfg), args.library)
    stack = HybridStack(cfg, kernels, tvm.cuda(0), layer_types=(kinds[0],), seed=0)
    stack.capture()
    decode_until(stack, args.decode)
    calls = swapped_calls(stack, args.op, benchmark_inputs(args.op, cfg, args.decode))
    planned = calls[0][2]
    for mode in args.compile_modes:
        os.environ["TVM_CUDA_COMPILE_MODE"] = mode
        calls.append((f"kernel compiled here ({mode})", compile_op(OPS[args.op], cfg, cuda()).func, planned))
    rows = []
    for label, func, call in calls:
        row = {"op": args.op, "key": naming.build(cfg, "cuda"), "position": args.decode, "swapped": label,
               "us": round(time_launch(func, call), 2)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
