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
import statistics
import sys

import numpy as np
import tvm
import tvm_ffi

from benchmarks.configs import STEP_MAX_LEN, step_config
from benchmarks.run import inputs, kernels_for, library_kernels
from benchmarks.timing import REPEATS
from gdn_tvm.build.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.graph import CudaGraph
from gdn_tvm.runtime.layers import kernel_names
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.signature import visible
from gdn_tvm.target import cuda
from gdn_tvm.traffic import LAUNCHES


def time_launch(func, args: list) -> float:
    """Median microseconds of `func(*args)`, LAUNCHES launches a replayed graph (the step breakdown's timing)."""
    graph = CudaGraph(lambda: [func(*args) for _ in range(LAUNCHES)], LAUNCHES)
    graph.replay()
    return statistics.median(graph.elapsed(1) for _ in range(REPEATS)) * 1e6 / LAUNCHES


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
    args = p.parse_args(argv)
    cfg = step_config(args.preset, args.batch)
    kernels = library_kernels(args.tuned, cfg) or kernels_for(cfg, kernel_names(cfg), args.library)
    kind = next(k for k in ("gdn", "attention") if args.op in kernel_names(cfg, (k,)))
    stack = HybridStack(cfg, kernels, tvm.cuda(0), layer_types=(kind,), seed=0)
    stack.capture()
    x = np.random.default_rng(0).standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
    slots = np.arange(cfg.batch, dtype=np.int32)
    for t in range(args.decode):
        stack.step_graph(x, np.full(cfg.batch, t, np.int32), slots)
    stack.write_inputs(x, np.full(cfg.batch, args.decode, np.int32), slots)
    layer = stack.layers[0]
    func, step_args = layer.plan[layer.launched.index(args.op)]
    signature = kernels[args.op].signature
    bench = {  # as TVM tensors: a torch argument would send the launch to torch's stream, outside the capture
        n: tvm_ffi.from_dlpack(v) if hasattr(v, "__dlpack__") else v
        for n, v in inputs(OPS[args.op], cfg, np.random.default_rng(1), position=args.decode).items()
    }
    names = [a.alias or a.name for a in signature]
    swaps = [None, *(a.name for a in visible(signature) if not a.is_scalar), "all"]
    timings = [(s, func, [bench[n] if s in (n, "all") else v for n, v in zip(names, step_args, strict=True)])
               for s in swaps]  # fmt: skip
    for mode in args.compile_modes:
        os.environ["TVM_CUDA_COMPILE_MODE"] = mode
        timings.append((f"kernel compiled here ({mode})", compile_op(OPS[args.op], cfg, cuda()).func, step_args))
    rows = []
    for swapped, f, call in timings:
        row = {"op": args.op, "key": cfg.key, "position": args.decode, "swapped": swapped,
               "us": round(time_launch(f, call), 2)}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
