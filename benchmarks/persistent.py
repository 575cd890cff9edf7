"""Launch boundaries against grid barriers at B = 1: a stack of GDN decoder layers, each its five kernels (the input
projection with its RMSNorm and conv, the fused delta rule, out_proj with its gated norm and residual add, gate|up
with its RMSNorm and SwiGLU, down with its residual add), run four ways on the same hand schedules, each layer its
own weights and states (L2-cold, as in a step):

  launches  5 L kernels, graph-replayed (what a step does today)
  solo      the same launches, each kernel `fuse`d alone on its own CTAs (no barrier: what fusion costs a kernel)
  layer     L persistent kernels (`codegen.persistent.fuse`), 4 grid barriers inside each
  stack     one persistent kernel, 5 L - 1 grid barriers

each fused way built for 2 and 3 CTAs an SM (`CTAS_PER_SM`: a kernel's bytes in flight grow with its resident warps;
one an SM ran 1.7-2x slower than the launches, four no better than three), each with and without the next kernel's
weights asked of L2 before each barrier (`fuse(prefetch=...)`). How many CTAs of 256 threads an SM holds is the
fused kernel's registers' to say (the built cubins, 0.8b: a layer 48 a thread, the stack 64, 4 an SM; the stack with
prefetches on 396 CTAs 96, 2): a grid with more never passes its first barrier, which the child processes below
report.

The layers are bound as a step binds them (`runtime.layers.Layer` over `plan.gdn(cfg, block=True)`, the MLP after
it), and each fused way is checked against the launches (the stream and every state, 1e-5: the same schedules,
compiled apart; counters back at zero) before it is timed, a mismatch recorded beside its times. Each fused way
first runs in a child process of its own with a time limit, so a barrier that never completes is reported, not hung
on; a GPU with fewer SMs than they were built for is refused. The kernels' own numerics are the GPU tests'. A bias
against the fused kernels: a module with a state pool's write side compiles every store evict-first
(`writes_state_pool` in codegen/compile.py), so in a fused module the activations one kernel leaves for the next are
stored so too.

python -m benchmarks.persistent --build DIR [--presets P ...] [--layers L]   (TVM compiler: writes DIR/<preset>/)
python -m benchmarks.persistent --build DIR --only PREFIX                     (rebuilds those modules of a built DIR)
python -m benchmarks.persistent --build DIR --launches-only                   (the kernels alone: the launches only)
python -m benchmarks.persistent --library DIR --out FILE.json                 (TVM runtime and a GPU)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b")
LAYERS = 8
MLP = ("gemv_gate_up_proj_rmsnorm_swiglu", "gemv_down_proj_residual")
# down's CTAs shaped as the other kernels' B = 1 layouts (8 warps of 32): the kernels a persistent kernel runs share
# one shape
KNOBS = {"gemv_down_proj_residual": {"rows": 8, "threads_per_row": 32}}
SMS = 132  # the H200's
CTAS_PER_SM = (2, 3)  # a persistent kernel's CTAs, all resident at once
POSITION = 2048
TOLERANCE = 1e-5  # fused against launches: the same schedules, compiled apart
PROBE_S = 60  # a child process's limit: loading the modules takes seconds, a pass well under one


def layer_ops(cfg) -> list[str]:
    """A GDN decoder layer's launches in order (an op launched twice listed twice)."""
    from gdn_tvm import plan

    return [*(launch.op for launch in plan.gdn(cfg, block=True).launches), *MLP]


def build(out: Path, presets: list[str], layers: int, only: str = "", fused: bool = True) -> None:
    """DIR/<preset>/: `<op>.so` and `solo-<op>.so` for each kernel of a layer, `layer-<variant>.so` (one layer
    fused) and `stack-<variant>.so` (all `layers` fused) for each variant (`<ctas>` or `<ctas>-prefetch`), and
    meta.json (with the kernels' signatures, so the run needs no compiler); `only`: the modules whose names start so;
    not `fused`: the kernels alone (the run times the launches only)."""
    import tvm

    from gdn_tvm.codegen import cuda_stub
    from gdn_tvm.codegen.library import export_library
    from gdn_tvm.codegen.persistent import fuse
    from gdn_tvm.config import DecodeConfig, preset
    from gdn_tvm.registry import OPS
    from gdn_tvm.runtime.module import arg_to_json
    from gdn_tvm.target import cuda

    for name in presets:
        cfg = DecodeConfig(preset(name), batch=1)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        ops = layer_ops(cfg)

        def scheduled(cfg=cfg, ops=ops):
            """Fresh scheduled PrimFuncs of one layer's kernels (a fused kernel's parameters must be distinct)."""
            return [OPS[op].schedule(cfg, "cuda", **KNOBS.get(op, {})).mod["main"] for op in ops]

        modules = dict(zip(ops, scheduled(), strict=True))
        if fused:
            for op, f in zip(ops, scheduled(), strict=True):  # on its own CTAs: each runs one, as launched
                modules[f"solo-{op}"] = fuse([f], int(f.body.block.body.extent))
        weights = [[a.name for a in OPS[op].signature(cfg) if a.role == "weight"] for op in ops]
        variants = [f"{SMS * k}{tail}" for k in CTAS_PER_SM for tail in ("", "-prefetch")] if fused else []
        for variant in variants:
            ctas, prefetch = _ctas(variant), variant.endswith("-prefetch")
            for kind, n in (("layer", 1), ("stack", layers)):
                names = [[] if i == 0 or not prefetch else weights[i % len(ops)] for i in range(n * len(ops))]
                funcs = [f for _ in range(n) for f in scheduled()]
                modules[f"{kind}-{variant}"] = fuse(funcs, ctas, prefetch=names)
        for key, func in ((k, f) for k, f in modules.items() if k.startswith(only)):
            mod, library = tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), folder / f"{key}.so"
            if tvm.runtime.enabled("cuda"):
                export_library(mod, cuda(), library)
            else:  # no GPU driver here: NVRTC through the stub driver, as `make build` does
                cuda_stub.export_with_stub(mod, cuda(), library, out / "cuda_stub")
        meta = {"preset": name, "layers": layers, "sms": SMS, "variants": variants, "ops": ops, "knobs": KNOBS}
        meta["solo"] = fused
        meta["signatures"] = {op: [arg_to_json(a) for a in OPS[op].signature(cfg)] for op in ops}
        (folder / "meta.json").write_text(json.dumps(meta))
        print(f"built {folder}")


class Stack:
    """`layers` GDN decoder layers on the GPU, bound as a step binds them, sharing the residual stream; `calls(way)`
    the (function, arguments) of one pass over them: `launches`, `solo` (each launch's kernel fused alone),
    `layer-<variant>` or `stack-<variant>` (`modules`: op, `solo-<op>` or fused way -> function)."""

    def __init__(self, cfg, meta: dict, modules: dict, rng: np.random.Generator, dev=None):
        import tvm

        from gdn_tvm import plan
        from gdn_tvm.runtime.kernel import Kernel
        from gdn_tvm.runtime.layers import Layer
        from gdn_tvm.runtime.module import arg_from_json
        from gdn_tvm.runtime.weights import random_weights
        from gdn_tvm.signature import bind

        dev, m = dev or tvm.cuda(0), cfg.model
        place = (dev.dlpack_device_type(), dev.index)
        signatures = {op: [arg_from_json(d) for d in args] for op, args in meta["signatures"].items()}
        kernels = {op: Kernel(op, modules[op], signatures[op], place) for op in meta["ops"]}

        def tensor(shape, scale=1.0, dtype=cfg.weight_dtype):
            return tvm.runtime.tensor((scale * rng.standard_normal(shape)).astype(np.float32).astype(dtype), dev)

        self.x = tensor((1, m.hidden), dtype="float32")
        step = {"slots": tvm.runtime.tensor(np.int32([0]), dev)}
        step["positions"] = tvm.runtime.tensor(np.int32([POSITION]), dev)
        act = tvm.runtime.empty((1, m.intermediate_size), "float32", dev)
        self.sync = tvm.runtime.tensor(np.zeros(2, np.int32), dev)
        self.layers, self.watched = [], [self.x]
        gate_up, down = (m.projections[p] for p in ("gate_up_proj", "down_proj"))
        for _ in range(meta["layers"]):
            inputs = {"x": self.x, "input_norm": tensor((m.hidden,), 0.1), **step}
            mixer = Layer(plan.gdn(cfg, block=True), cfg, kernels, random_weights(m, "gdn", rng), inputs)
            up = {"w": tensor(gate_up, gate_up[1] ** -0.5), "x": self.x, "norm_weight": tensor((m.hidden,), 0.1)}
            up["y"] = act
            dn = {"w": tensor(down, down[1] ** -0.5), "x": act, "residual": self.x}
            mlp = [(kernels[op].func, bind(kernels[op].signature, v)) for op, v in zip(MLP, (up, dn), strict=True)]
            self.layers.append([*mixer.launches, *mlp])
            self.watched += mixer.states
        self.modules, self.ops = modules, meta["ops"]

    def calls(self, way: str) -> list:
        if way == "launches":
            return [call for layer in self.layers for call in layer]
        if way == "solo":
            return [
                (self.modules[f"solo-{op}"], [*args, self.sync])
                for layer in self.layers
                for op, (_, args) in zip(self.ops, layer, strict=True)
            ]
        func = self.modules[way]
        if way.startswith("layer"):
            return [(func, [*(a for _, args in layer for a in args), self.sync]) for layer in self.layers]
        return [(func, [*(a for layer in self.layers for _, args in layer for a in args), self.sync])]

    def snapshot(self) -> list[np.ndarray]:
        return [t.numpy() for t in self.watched]

    def restore(self, values: list[np.ndarray]) -> None:
        for t, v in zip(self.watched, values, strict=True):
            t.copyfrom(v)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Relative L-infinity error of `got` against `want` (NaN where either holds a NaN the other does not)."""
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return float("nan")
    diff = np.abs(np.nan_to_num(got.astype(np.float64)) - np.nan_to_num(want.astype(np.float64)))
    return float(diff.max() / max(float(np.abs(np.nan_to_num(want.astype(np.float64))).max()), 1e-30))


def _load(folder: Path, keys) -> dict:
    """key -> the `main` of `folder/<key>.so` (TVM's CUDA loader registered first where the runtime lacks it)."""
    import tvm

    from gdn_tvm.runtime.module import load_cuda_runtime

    load_cuda_runtime(folder)
    return {k: tvm.runtime.load_module(str(folder / f"{k}.so"))["main"] for k in keys}


def _time(stack: Stack, way: str) -> float:
    """Median microseconds of one pass `way`, graph-replayed (9 samples of 20 replays)."""
    from benchmarks.timing import replayed_us
    from gdn_tvm.runtime.graph import CudaGraph

    calls = stack.calls(way)
    return replayed_us(CudaGraph(lambda: [f(*a) for f, a in calls], len(calls)))


def _ctas(variant: str) -> int:
    """The CTAs of a fused variant (`264`, `264-prefetch`)."""
    return int(variant.split("-")[0])


def _probe(library: Path, folder: str, way: str) -> str | None:
    """One pass of fused `way` in a child process with a time limit: None, or why it failed (a barrier that never
    completes, as when not every CTA is resident, times out)."""
    cmd = [sys.executable, "-m", "benchmarks.persistent", "--library", str(library), "--probe", f"{folder}:{way}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_S)
    except subprocess.TimeoutExpired:
        return f"{way}: no exit in {PROBE_S} s"
    return f"{way}: {done.stderr[-2000:]}" if done.returncode else None


def _check(stack: Stack, way: str, start: list, want: list, entry: dict) -> str | None:
    """One pass `way` from the states `start` against the launches' (`want`), into `entry` (`<kind>_vs_launches`,
    `<kind>_sync_left`): None, or what is wrong (1e-5, counters back at zero)."""
    import tvm

    kind = way.split("-")[0]
    stack.restore(start)
    for func, args in stack.calls(way):
        func(*args)
    tvm.cuda(0).sync()
    error = max(relative_error(got, w) for got, w in zip(stack.snapshot(), want, strict=True))
    left = stack.sync.numpy().tolist()
    entry[f"{kind}_vs_launches"], entry[f"{kind}_sync_left"] = error, left
    if not error <= TOLERANCE or any(left):  # NaN fails too
        return f"{kind}: relative error {error} against the launches, counters {left}"
    return None


def run(library: Path, out: Path, probe: str | None) -> int:
    import torch
    import tvm

    from benchmarks.record import Results
    from gdn_tvm.config import DecodeConfig, preset

    if probe:  # the child process: one pass of the given fused way
        name, way = probe.split(":")
        folder = library / name
        meta = json.loads((folder / "meta.json").read_text())
        cfg = DecodeConfig(preset(meta["preset"]), batch=1)
        stack = Stack(cfg, meta, _load(folder, [*meta["ops"], way]), np.random.default_rng(0))
        for func, args in stack.calls(way):
            func(*args)
        tvm.cuda(0).sync()
        print("probe ok")
        return 0
    results = Results(str(out), "benchmarks.persistent", None, position=POSITION)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for folder in sorted(p for p in library.iterdir() if (p / "meta.json").exists()):
        meta = json.loads((folder / "meta.json").read_text())
        cfg = DecodeConfig(preset(meta["preset"]), batch=1)
        row: dict = {"preset": meta["preset"], "layers": meta["layers"], "ops": meta["ops"], "fused": []}
        if sms < meta["sms"]:  # fewer SMs than built for: each would need more CTAs than it may hold
            row["error"] = f"built for {meta['sms']} SMs, {sms} here"
            results.add(row)
            continue
        fused = []  # (way, its variant's entry)
        for variant in meta["variants"]:
            entry: dict = {"variant": variant, "ctas": _ctas(variant)}
            row["fused"].append(entry)
            for way in (f"{kind}-{variant}" for kind in ("layer", "stack")):
                if error := _probe(library, folder.name, way):
                    entry[f"{way.split('-')[0]}_error"] = error
                else:
                    fused.append((way, entry))
        ways = [way for way, _ in fused]
        solo = [f"solo-{op}" for op in meta["ops"]] if meta.get("solo", True) else []
        stack = Stack(cfg, meta, _load(folder, [*meta["ops"], *solo, *ways]), np.random.default_rng(1))
        start = stack.snapshot()
        for func, args in stack.calls("launches"):
            func(*args)
        tvm.cuda(0).sync()
        want = stack.snapshot()
        row["launches_us"] = _time(stack, "launches")
        row["launches_us_per_layer"] = round(row["launches_us"] / meta["layers"], 2)
        if meta.get("solo", True):
            if error := _check(stack, "solo", start, want, row):
                row["solo_error"] = error
            row["solo_us"] = _time(stack, "solo")
            row["solo_us_per_layer"] = round(row["solo_us"] / meta["layers"], 2)
        boundaries = len(meta["ops"]) * meta["layers"] - 1
        for way, entry in fused:
            kind = way.split("-")[0]
            if error := _check(stack, way, start, want, entry):  # recorded; timed all the same, as a wrong
                entry[f"{kind}_error"] = error  # result's time is still what the kernels took
            entry[f"{kind}_us"] = _time(stack, way)
            entry[f"{kind}_us_per_layer"] = round(entry[f"{kind}_us"] / meta["layers"], 2)
            if kind == "stack":
                entry["saved_us_per_boundary"] = round((row["launches_us"] - entry["stack_us"]) / boundaries, 3)
        print(json.dumps(row))
        results.add(row)
    results.finish()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, help="compile the modules into this folder")
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--only", default="", help="with --build: rebuild only the modules whose names start so")
    p.add_argument("--launches-only", action="store_true", help="with --build: the kernels alone, nothing fused")
    p.add_argument("--library", type=Path, help="check and time the modules of this folder on the GPU")
    p.add_argument("--out", type=Path, default=Path("persistent.json"))
    p.add_argument("--probe", help=argparse.SUPPRESS)  # the child process's folder:way
    args = p.parse_args(argv)
    if args.build:
        build(args.build, args.presets, args.layers, args.only, fused=not args.launches_only)
        return 0
    if args.library:
        return run(args.library, args.out, args.probe)
    p.error("give --build DIR or --library DIR")
    return 2


if __name__ == "__main__":
    sys.exit(main())
