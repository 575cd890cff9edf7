"""Launch boundaries against grid barriers at B = 1: a stack of decoder-layer MLPs (gate|up with its RMSNorm prologue
and SwiGLU epilogue, then down with the residual add) run three ways on the same schedules, L2-cold (each layer its
own weights, as in a step):

  launches  2 L kernels, graph-replayed (what a step does today)
  layer     L persistent kernels (`codegen.persistent.fuse`), a grid barrier inside each
  stack     one persistent kernel, 2 L - 1 grid barriers

Each way is checked against the launches' result (1e-5: the same schedules, compiled apart) and the launches against
the ops' float64 references before anything is timed; the fused modules first run in a child process with a time
limit, so a barrier that never completes is reported, not hung on.

python -m benchmarks.persistent --build DIR [--presets P ...] [--layers L]   (TVM compiler: writes DIR/<preset>/)
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
GATE_UP, DOWN = "gemv_gate_up_proj_rmsnorm_swiglu", "gemv_down_proj_residual"
# down's CTAs shaped as gate|up's B = 1 layout (8 warps of 32): the kernels a persistent kernel runs share one shape
DOWN_KNOBS = {"rows": 8, "threads_per_row": 32}
SMS = 132  # the H200's: every CTA of a persistent kernel resident at once, one an SM


def build(out: Path, presets: list[str], layers: int) -> None:
    """DIR/<preset>/{gate_up,down,layer,stack}.so and meta.json (the parameter order of each)."""
    import tvm

    from gdn_tvm.codegen import cuda_stub
    from gdn_tvm.codegen.library import export_library
    from gdn_tvm.codegen.persistent import fuse
    from gdn_tvm.config import DecodeConfig, preset
    from gdn_tvm.registry import OPS
    from gdn_tvm.target import cuda

    for name in presets:
        cfg = DecodeConfig(preset(name), batch=1)
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)

        def pair(cfg=cfg):
            """Fresh scheduled PrimFuncs of one layer's two kernels (a fused kernel's parameters are distinct)."""
            return [
                OPS[GATE_UP].schedule(cfg, "cuda").mod["main"],
                OPS[DOWN].schedule(cfg, "cuda", **DOWN_KNOBS).mod["main"],
            ]

        gate_up, down = pair()
        modules = {"gate_up": gate_up, "down": down, "layer": fuse(pair(), SMS)}
        modules["stack"] = fuse([f for _ in range(layers) for f in pair()], SMS)
        for key, func in modules.items():
            mod, library = tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), folder / f"{key}.so"
            if tvm.runtime.enabled("cuda"):
                export_library(mod, cuda(), library)
            else:  # no GPU driver here: NVRTC through the stub, as `make build` does
                cuda_stub.export_with_stub(mod, cuda(), library, out / "cuda_stub")
        meta = {"layers": layers, "ctas": SMS, "down_knobs": DOWN_KNOBS, "preset": name}
        (folder / "meta.json").write_text(json.dumps(meta))
        print(f"built {folder}")


def _values(cfg, op_name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from gdn_tvm.registry import OPS
    from gdn_tvm.signature import sample, visible

    return {a.name: sample(a, rng) for a in visible(OPS[op_name].signature(cfg))}


class Stack:
    """L layers' MLP weights on the GPU, the residual stream, the activation and the barrier counters; `args(key)` the
    parameters of a module over them (gate_up / down: one layer's, layer / stack: per layer or all)."""

    def __init__(self, cfg, layers: int, rng: np.random.Generator):
        import tvm

        from gdn_tvm.registry import OPS
        from gdn_tvm.signature import bind

        self.cfg, self.layers = cfg, layers
        dev = tvm.cuda(0)
        up = _values(cfg, GATE_UP, rng)
        self.host = {"x": up["x"], "norm": [], "gate_up": [], "down": []}
        self.x = tvm.runtime.tensor(up["x"], dev)
        self.act = tvm.runtime.empty(up["y"].shape, "float32", dev)
        self.sync = tvm.runtime.tensor(np.zeros(2, np.int32), dev)
        self.layer_args = []
        for _ in range(layers):
            u, d = _values(cfg, GATE_UP, rng), _values(cfg, DOWN, rng)
            self.host["norm"].append(u["norm_weight"])
            self.host["gate_up"].append(u["w"])
            self.host["down"].append(d["w"])
            gu = {
                "w": tvm.runtime.tensor(u["w"], dev),
                "x": self.x,
                "norm_weight": tvm.runtime.tensor(u["norm_weight"], dev),
                "y": self.act,
            }
            dn = {"w": tvm.runtime.tensor(d["w"], dev), "x": self.act, "residual": self.x}
            self.layer_args.append((bind(OPS[GATE_UP].signature(cfg), gu), bind(OPS[DOWN].signature(cfg), dn)))

    def reset(self) -> None:
        self.x.copyfrom(self.host["x"])

    def calls(self, modules: dict, key: str) -> list:
        """(function, args) of one pass over the stack the `key` way."""
        if key == "launches":
            return [(modules[k], a) for up, dn in self.layer_args for k, a in (("gate_up", up), ("down", dn))]
        if key == "layer":
            return [(modules["layer"], [*up, *dn, self.sync]) for up, dn in self.layer_args]
        return [(modules["stack"], [a for up, dn in self.layer_args for a in (*up, *dn)] + [self.sync])]


def reference(stack: Stack) -> np.ndarray:
    """The stream after the stack, by the ops' float64 references layer by layer."""
    from gdn_tvm.registry import OPS
    from gdn_tvm.verify import reference_copy

    x = stack.host["x"].astype(np.float64)
    for i in range(stack.layers):
        up = reference_copy({"w": stack.host["gate_up"][i], "x": x, "norm_weight": stack.host["norm"][i]})
        up["y"] = np.zeros((1, stack.cfg.model.intermediate_size))
        OPS[GATE_UP].run_reference(stack.cfg, up)
        dn = {"w": stack.host["down"][i].astype(np.float64), "x": up["y"], "residual": x.copy()}
        OPS[DOWN].run_reference(stack.cfg, dn)
        x = dn["residual"]
    return x


def run(library: Path, out: Path, probe: str | None) -> int:
    import tvm

    from benchmarks.record import Results
    from gdn_tvm.config import DecodeConfig, preset
    from gdn_tvm.runtime.graph import CudaGraph
    from gdn_tvm.verify import mismatch

    folders = sorted(p for p in library.iterdir() if (p / "meta.json").exists())
    if probe:  # child process: one pass the fused ways, then report the stream
        folder = library / probe
        meta = json.loads((folder / "meta.json").read_text())
        stack = Stack(DecodeConfig(preset(meta["preset"]), batch=1), meta["layers"], np.random.default_rng(0))
        modules = {k: tvm.runtime.load_module(str(folder / f"{k}.so"))["main"] for k in ("layer", "stack")}
        for key in ("layer", "stack"):
            for func, args in stack.calls(modules, key):
                func(*args)
            tvm.cuda(0).sync()
        print("probe ok")
        return 0
    results = Results(str(out), "benchmarks.persistent", None, sms=SMS)
    for folder in folders:
        meta = json.loads((folder / "meta.json").read_text())
        row: dict = {"preset": meta["preset"], "layers": meta["layers"], "ctas": meta["ctas"]}
        try:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks.persistent", "--library", str(library), "--probe", folder.name],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode:
                raise RuntimeError(f"probe failed: {done.stderr[-2000:]}")
        except (RuntimeError, subprocess.TimeoutExpired) as err:
            row["error"] = f"fused modules: {err}"
            results.add(row)
            continue
        cfg = DecodeConfig(preset(meta["preset"]), batch=1)
        stack = Stack(cfg, meta["layers"], np.random.default_rng(1))
        modules = {
            k: tvm.runtime.load_module(str(folder / f"{k}.so"))["main"] for k in ("gate_up", "down", "layer", "stack")
        }
        streams = {}
        for key in ("launches", "layer", "stack"):
            stack.reset()
            for func, args in stack.calls(modules, key):
                func(*args)
            tvm.cuda(0).sync()
            streams[key] = stack.x.numpy()
        row["launches_vs_reference"] = mismatch(streams["launches"], reference(stack), 1e-3)
        for key in ("layer", "stack"):
            row[f"{key}_vs_launches"] = mismatch(streams[key], streams["launches"], 1e-5)
            row[f"{key}_sync_left"] = stack.sync.numpy().tolist()
        for key in ("launches", "layer", "stack"):
            calls = stack.calls(modules, key)
            graph = CudaGraph(lambda calls=calls: [f(*a) for f, a in calls], len(calls))
            graph.replay()
            samples = sorted(graph.elapsed(20) / 20 for _ in range(9))
            row[f"{key}_us"] = round(samples[len(samples) // 2] * 1e6, 2)
            row[f"{key}_us_per_layer"] = round(row[f"{key}_us"] / meta["layers"], 2)
        row["bytes_per_layer"] = int(sum(np.asarray(stack.host[k][0]).nbytes for k in ("gate_up", "down")))
        row["floor_us_per_layer"] = round(row["bytes_per_layer"] / 4.3e12 * 1e6, 2)
        boundaries = 2 * meta["layers"] - 1
        row["saved_us_per_boundary"] = round((row["launches_us"] - row["stack_us"]) / boundaries, 3)
        print(json.dumps(row))
        results.add(row)
    results.finish()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", type=Path, help="compile the modules into this folder (TVM compiler)")
    p.add_argument("--presets", nargs="+", default=list(PRESETS))
    p.add_argument("--layers", type=int, default=LAYERS)
    p.add_argument("--library", type=Path, help="run the modules of this folder (TVM runtime, a GPU)")
    p.add_argument("--out", type=Path, default=Path("persistent.json"))
    p.add_argument("--probe", help=argparse.SUPPRESS)  # the child process's folder
    args = p.parse_args(argv)
    if args.build:
        build(args.build, args.presets, args.layers)
        return 0
    if args.library:
        return run(args.library, args.out, args.probe)
    p.error("give --build DIR or --library DIR")
    return 2


if __name__ == "__main__":
    sys.exit(main())
