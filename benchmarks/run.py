"""The benchmark runner: registry ops on the GPU, hand schedules vs PyTorch (and fla for the delta rule).

python -m benchmarks.run [--preset qwen3.5-4b] [--batches 1 32 256] [--ops NAME ...] [--out FILE]
    [--weight-dtype D] [--kv-dtype D] [--state-dtype D]
Per op and shape: median microseconds (CUDA-graph replayed, rotating inputs so L2 doesn't serve them), bytes
moved, achieved GB/s and % of the 4.3 TB/s copy peak; the baselines measured in the same run, the same way
(graph-replayed, as engines replay a decode step: eager PyTorch would time its host overhead, ~20 us a call). The
storage dtypes (float32 or bfloat16, default `DecodeConfig`'s) set what the kernels read and store; the PyTorch GEMV
and attention baselines then run on bf16 activations, as engines do (`torch_ops.activation_dtype`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Protocol

import ml_dtypes
import numpy as np
import torch
import tvm

from benchmarks import fla_ops, torch_ops
from benchmarks.configs import OP_BATCHES, OP_PRESET, op_config
from benchmarks.record import Results
from benchmarks.timing import gbps, time_graph
from gdn_tvm import naming
from gdn_tvm.cli import add_dtype_arguments, dtypes
from gdn_tvm.codegen.compile import compile_dlight, compile_op
from gdn_tvm.codegen.library import cuda_compiler
from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import OPS, Op
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.runtime.module import ManifestError, load, read_manifest
from gdn_tvm.signature import bind, sample, visible
from gdn_tvm.target import cuda, gpu_spec
from gdn_tvm.traffic import rotating_sets, traffic
from gdn_tvm.verify import mismatch, reference_copy, tolerance

GPU = gpu_spec(cuda())  # the GPU the benchmarks rate against (its measured copy peak)


def inputs(
    op: Op, cfg: DecodeConfig, rng: np.random.Generator, device: str = "cuda", position: int | None = None
) -> dict:
    """Torch inputs on `device`: every lane active (slots 0..B-1), every sequence at `position` (default: the last
    cache row)."""
    at = cfg.max_len - 1 if position is None else position
    values = {}
    for a in visible(op.signature(cfg)):
        if a.name == "slots":
            v = np.arange(cfg.batch, dtype=np.int32)
        elif a.name == "positions":
            v = np.full(a.shape, at, np.int32)
        else:
            v = sample(a, rng)
        values[a.name] = to_torch(np.nan_to_num(v)).to(device)
    return values


def to_torch(v: np.ndarray) -> torch.Tensor:
    """A torch tensor sharing host array `v` (a bf16 one through a uint16 view: torch takes no ml_dtypes bf16)."""
    if v.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(v)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A host numpy copy of `t`, bf16 as ml_dtypes bf16 (so a check allows it its one bf16 ulp)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.uint16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def input_sets(
    op: Op, cfg: DecodeConfig, rng: np.random.Generator, sets: int, device: str = "cuda", position: int | None = None
) -> list[dict]:
    """`sets` distinct copies of one random input set (every sequence at `position`, default the last row), copied
    on the device: sampling each on the host stalled the B=256 run (the scatter moves 2 MiB but takes 2 GiB of
    caches, and asks for 24 sets)."""
    first = inputs(op, cfg, rng, device, position)
    return [first] + [clone(first) for _ in range(sets - 1)]


def clone(values: dict) -> dict:
    """`values` with every tensor copied."""
    return {n: v.clone() for n, v in values.items()}


def time_kernel(kernel: Kernel, value_sets: list[dict]) -> float:
    """Median graph-replayed microseconds of `kernel` rotating over `value_sets`."""
    bound = [bind(kernel.signature, v) for v in value_sets]
    return time_graph(lambda i: kernel.func(*bound[i]), len(bound))


def kernels_for(cfg: DecodeConfig, names: list[str], library: str | None) -> dict[str, Kernel]:
    """Hand-scheduled kernels compiled here, or loaded from a prebuilt library (`python -m gdn_tvm.export --target
    cuda --allow-hand ... --out DIR` on any machine with the CUDA headers, by the pinned NVRTC: no compile time on the
    GPU machine)."""
    if library is None:
        return {name: compile_op(OPS[name], cfg, cuda()) for name in names}
    kernels = load(library, cfg, "cuda")
    return {name: kernels[name] for name in names}


def library_kernels(root: str | None, cfg: DecodeConfig, tuned_only: bool = False) -> dict[str, Kernel]:
    """The build of `cfg` under `root` (tuned, or dlight), or none (said on stdout) when `root` has no build of
    that config; with `tuned_only`, only the functions with a tuning record (a tuned build fills workloads without
    one with the hand schedule: those get no tuned column)."""
    if root is None:
        return {}
    try:
        kernels = load(root, cfg, "cuda")
    except ManifestError as err:
        print(f"no build of {naming.build(cfg, 'cuda')} under {root}: {err}", flush=True)
        return {}
    if not tuned_only:
        return kernels
    hand = untuned(manifest_functions(root, cfg))
    if hand:
        print(f"{naming.build(cfg, 'cuda')} under {root}: not tuned: {', '.join(hand)}", flush=True)
    return {n: k for n, k in kernels.items() if n not in hand}


def manifest_functions(root: str, cfg: DecodeConfig) -> dict[str, dict]:
    """The manifest entries of the functions of `cfg`'s CUDA build under `root`."""
    return read_manifest(root, cfg, "cuda")[1]["functions"]


def untuned(functions: dict[str, dict]) -> list[str]:
    """The functions without a tuning record (a tuned build gives them the hand schedule)."""
    return sorted(n for n, f in functions.items() if f["schedule"] != "tuned")


def build_compiler(root: str | None, cfg: DecodeConfig) -> str:
    """The CUDA compiler of `cfg`'s kernels: the manifest's under `root` (a prebuilt build), else this machine's (the
    kernels compile here)."""
    if root is not None:
        try:
            return read_manifest(root, cfg, "cuda")[1].get("cuda_compile", "unknown")
        except ManifestError:
            pass
    return cuda_compiler()


def schedule_summary(root: str, cfg: DecodeConfig) -> str:
    """Where the functions of `cfg`'s build under `root` got their schedules: "tuned", or "tuned N/M (hand: ...)"."""
    functions = manifest_functions(root, cfg)
    hand = untuned(functions)
    return "tuned" if not hand else f"tuned {len(functions) - len(hand)}/{len(functions)} (hand: {', '.join(hand)})"


class Step(Protocol):
    """A baseline bound to one input set: calling it runs one step; `outputs()` gives the last step's outputs and
    states by the op's argument names, in the kernel's layout; `tolerance` is its check's relative L-inf tolerance
    where that is not the op's own (None)."""

    tolerance: float | None

    def __call__(self) -> None: ...

    def outputs(self) -> dict[str, torch.Tensor]: ...


class TorchStep:
    """The PyTorch implementation of `op` on `values` (updated in place, like the kernel; activations converted to
    `torch_ops.activation_dtype` first); `outputs()` gives its outputs and states by argument name."""

    def __init__(self, op: Op, cfg: DecodeConfig, values: dict) -> None:
        self.run, self.cfg, self.values = torch_ops.baseline(op), cfg, torch_ops.activations(op, cfg, values)
        self.tolerance = torch_ops.tolerance(op, cfg)
        self.names = [a.name for a in visible(op.signature(cfg)) if a.role in ("out", "state")]

    def __call__(self) -> None:
        self.run(self.cfg.model, seq_len=self.cfg.max_len, **self.values)

    def outputs(self) -> dict[str, torch.Tensor]:
        return {n: self.values[n] for n in self.names}


def baselines(op: Op) -> dict[str, tuple[Callable[[DecodeConfig, dict], Step], Callable]]:
    """The same-run baselines of `op`: column label -> (a step on one input set, its timer). PyTorch and fla (the
    delta rule: both state layouts, and in place) are graph-replayed, like ours; one that cannot be captured is
    recorded as failed."""
    found: dict[str, tuple[Callable[[DecodeConfig, dict], Step], Callable]] = {}
    if torch_ops.baseline(op) is not None:
        found["torch"] = (lambda cfg, v: TorchStep(op, cfg, v), time_graph)
    if op.family == "delta_rule":
        fused = bool(op.flags.get("fused", False))
        for label, (v_first, in_place) in fla_ops.LAYOUTS.items():
            found[label] = (lambda cfg, v, f=v_first, p=in_place: fla_ops.FlaStep(cfg, v, fused, f, p), time_graph)
    return found


def expected(op: Op, cfg: DecodeConfig, values: dict) -> dict[str, np.ndarray]:
    """The float64 reference's outputs and states on (host copies of) `values`, by argument name."""
    expect = reference_copy({n: to_numpy(v) for n, v in values.items()})
    op.run_reference(cfg, expect)
    return {a.name: expect[a.name] for a in visible(op.signature(cfg)) if a.role in ("out", "state")}


def check(
    op: Op,
    cfg: DecodeConfig,
    outputs: dict[str, torch.Tensor],
    expect: dict[str, np.ndarray],
    tol: float | None = None,
) -> tuple[float, str | None]:
    """The largest relative L-inf error of `outputs` against `expect`, and why they do not match (None: they do,
    within `tol`, by default the per-op tolerance of the op's dtypes at `cfg`; bit for bit for data movement)."""
    worst, why = 0.0, None
    if tol is None:
        tol = 0 if op.exact else tolerance(a.dtype for a in visible(op.signature(cfg)))
    for name, ref in expect.items():
        host = to_numpy(outputs[name])
        out = host.astype(np.float64)
        if out.shape == ref.shape and not np.isnan(out).any():
            worst = max(worst, float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30)))
        why = why or (f"{name}: {reason}" if (reason := mismatch(host, ref, tol)) else None)
    return worst, why


def bench_op(
    op: Op, cfg: DecodeConfig, kernel: Kernel, rng: np.random.Generator, others: dict[str, Kernel] | None = None
) -> dict:
    """Hand kernel, the other TVM kernels given (`tuned`, `dlight`) and the baselines (`baselines`): each checked
    against the float64 reference on the first input set, then timed. A baseline that does not match, or fails,
    is recorded (`<label>_error`) and not timed; a TVM kernel that does not match is recorded and timed, and the
    run ends with an error (`main`)."""
    nbytes = traffic(op, cfg)
    sets = rotating_sets(nbytes, GPU)
    value_sets = input_sets(op, cfg, rng, sets)
    expect, pristine = expected(op, cfg, value_sets[0]), clone(value_sets[0])  # timing changes the sets' states
    row = {"op": op.name, "batch": cfg.batch, "key": op.workload_key(cfg, "cuda"), "bytes": nbytes, "sets": sets}
    for label, k in {"tvm": kernel, **(others or {})}.items():
        copy = clone(pristine)
        k.launch(copy)
        row[f"{label}_rel_err"], why = check(op, cfg, copy, expect)
        if why:
            row[f"{label}_error"] = f"wrong: {why}"
        row[f"{label}_us"] = time_kernel(k, value_sets)
    if nbytes <= HOT_BYTES:  # inside a decode step a small op's inputs were just written: they sit in L2
        row["tvm_hot_us"] = time_kernel(kernel, value_sets[:1])
    for label, (make, timer) in baselines(op).items():
        try:
            first = make(cfg, clone(pristine))
            first()
            row[f"{label}_rel_err"], why = check(op, cfg, first.outputs(), expect, first.tolerance)
            if why:
                row[f"{label}_error"] = f"wrong: {why}"
                continue
            steps = [make(cfg, v) for v in value_sets]
            row[f"{label}_us"] = timer(lambda i, steps=steps: steps[i](), sets)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - recorded, not hidden: the JSON says why the baseline did not run
            row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:300]
    for k in [k for k in row if k.endswith("_us") and k != "tvm_hot_us"]:
        row[k.replace("_us", "_gbps")] = round(gbps(nbytes, row[k]), 1)
    row["tvm_pct_peak"] = round(100 * row["tvm_gbps"] / GPU.peak_gbps, 1)
    if op.family == "delta_rule":
        row |= copy_floor(value_sets, sets)
    return row


def copy_floor(value_sets: list[dict], sets: int) -> dict:
    """The recurrent state's bytes read once and written once with no compute: torch's device copy of each set's
    state into a buffer of its own, graph-replayed over the same rotating sets as the kernels, checked bit for bit
    first; the floor an in-place update of the state runs against (`copy_us`, `copy_bytes`: read + written,
    `copy_pct_peak`). A copy that fails is recorded (`copy_error`)."""
    try:
        states = [v["state"] for v in value_sets]
        copies = [torch.empty_like(s) for s in states]
        copies[0].copy_(states[0])
        if not torch.equal(copies[0], states[0]):
            return {"copy_error": "wrong: the copy differs from the state"}
        us = time_graph(lambda i: copies[i].copy_(states[i]), sets)
    except Exception as e:  # noqa: BLE001 - recorded, not hidden
        return {"copy_error": f"{type(e).__name__}: {e}"[:300]}
    moved = 2 * states[0].numel() * states[0].element_size()
    return {"copy_us": us, "copy_bytes": moved, "copy_pct_peak": round(100 * gbps(moved, us) / GPU.peak_gbps, 1)}


HOT_BYTES = 4 * 2**20  # ops moving at most this much are also timed L2-hot (`tvm_hot_us`)


def empty_launch_us() -> float:
    """A one-thread kernel, graph-replayed: the launch floor for B = 1 ops."""
    from tvm.script import tirx as T

    from gdn_tvm.codegen.compile import compile_mod

    @T.prim_func
    def empty(x: T.Buffer((1,), "float32")):
        for i in T.thread_binding(1, thread="threadIdx.x"):
            x[i] = T.float32(0)

    func = compile_mod(tvm_module(empty), cuda())["main"]
    x = torch.zeros(1, device="cuda")
    return time_graph(lambda i: func(x), 1)


def tvm_module(func):
    return tvm.IRModule({"main": func.with_attr("global_symbol", "main")})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default=OP_PRESET)
    p.add_argument("--batches", type=int, nargs="+", default=list(OP_BATCHES))
    p.add_argument("--ops", nargs="+", default=list(OPS))
    p.add_argument("--out", default="benchmarks/results/h200_ops.json")
    p.add_argument("--library", help="build root holding prebuilt CUDA modules for these configs (default: compile)")
    p.add_argument("--tuned", help="build root of `make build --target cuda` from tuning logs: adds a tuned column")
    p.add_argument("--dlight", action="store_true", help="add TVM's dlight default schedules (where they apply)")
    p.add_argument("--dlight-library", help="build root of prebuilt dlight modules (`benchmarks.prebuild`): --dlight")
    add_dtype_arguments(p)
    args = p.parse_args(argv)
    rng = np.random.default_rng()  # fresh inputs each run
    floor = empty_launch_us()
    print(f"empty kernel (graph-replayed): {floor:.2f} us", flush=True)
    results = Results(
        args.out,
        "benchmarks.run",
        argv,
        preset=args.preset,
        dtypes=dtypes(args),
        peak_gbps=GPU.peak_gbps,
        empty_launch_us=floor,
        baseline_timing="cuda-graph",
        compilers={},
    )
    wrong: list[str] = []
    for batch in args.batches:
        cfg = op_config(args.preset, batch, **dtypes(args))
        kernels = kernels_for(cfg, args.ops, args.library)
        tuned = library_kernels(args.tuned, cfg, tuned_only=True)
        dlight = library_kernels(args.dlight_library, cfg)
        compilers = {"tvm": build_compiler(args.library, cfg)}  # one design's kernels differ by compiler
        if tuned:
            compilers["tuned"] = build_compiler(args.tuned, cfg)
        if dlight or args.dlight:
            compilers["dlight"] = build_compiler(args.dlight_library if dlight else None, cfg)
        results.data["compilers"][f"B={batch}"] = compilers
        for name in args.ops:
            others = {"tuned": tuned[name]} if name in tuned else {}
            if dlight:
                if name in dlight:
                    others["dlight"] = dlight[name]
                else:
                    print(f"{name}: dlight does not apply (not in the prebuilt dlight module)", flush=True)
            elif args.dlight:
                try:
                    others["dlight"] = compile_dlight(OPS[name], cfg, cuda())
                except (ValueError, tvm.s_tir.ScheduleError) as e:  # no dlight rule fits this op: the row says so
                    print(f"{name}: dlight does not apply ({type(e).__name__})", flush=True)
            row = bench_op(OPS[name], cfg, kernels[name], rng, others)
            results.add(row)
            wrong += [f"{name} B={batch} {k}: {row[k]}" for k in row if k.endswith("_error") and k[:-6] in TVM_LABELS]
            shown = [k for k in row if k.endswith("_us") and k not in ("tvm_us", "tvm_hot_us")]
            failed = [k[: -len("_error")] for k in row if k.endswith("_error")]
            base = "  ".join([f"{k}={row[k]:.2f}" for k in shown] + [f"{k}=FAILED" for k in failed])
            print(
                f"{name:28s} B={batch:<4d} {row['tvm_us']:9.2f} us {row['tvm_gbps']:8.1f} GB/s "
                f"{row['tvm_pct_peak']:5.1f}%  {base}",
                flush=True,
            )
            torch.cuda.empty_cache()
    results.finish()
    for line in wrong:
        print(f"WRONG {line}", file=sys.stderr)
    return 1 if wrong else 0


TVM_LABELS = ("tvm", "tuned", "dlight")  # our kernels: a mismatch fails the run (a baseline's is only recorded)


if __name__ == "__main__":
    sys.exit(main())
