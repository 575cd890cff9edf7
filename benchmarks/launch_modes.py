"""One model, several builds of its kernels (plain launches, programmatic dependent launch with and without weight
prefetch: `benchmarks.prebuild --model --prefetch-mib N`): each build's logits checked bit for bit against the first
build's over `CHECK_STEPS` steps (the builds differ in when kernels run, never in what they compute), then the
graph-replayed step timed, the builds taking turns (`ROUNDS` rounds of `benchmarks.model`'s timing each).

python -m benchmarks.launch_modes --builds plain=ROOT pdl0=ROOT ... [--cases qwen3.5-0.8b:1 ...] [--out FILE]
Needs only the TVM runtime (and torch for the random weights).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import numpy as np
import torch
import tvm

from benchmarks.configs import MODEL_MAX_LEN, model_config
from benchmarks.model import POSITION, floor_bytes, gpu_weights, start_lanes, step_us
from benchmarks.record import Results
from gdn_tvm.plan import model as model_plan
from gdn_tvm.runtime.model import Model, Request
from gdn_tvm.runtime.module import load, read_manifest
from gdn_tvm.target import DEFAULT_GPU as GPU

CHECK_STEPS = 48  # steps from zero states whose logits every build must reproduce exactly
ROUNDS = 5


def logits_trace(model: Model, ids: np.ndarray) -> np.ndarray:
    """[steps, B, V] logits of the steps feeding `ids` [steps, B] as prompt tokens from zero states (eager launches
    replayed from the captured graphs, as `generate` runs them)."""
    steps, B = ids.shape
    for lane in range(B):
        model.start(Request([*ids[:, lane].tolist(), 0], 1))
    out = []
    for _ in range(steps):
        model.events(model.launch())
        out.append(model.logits.numpy().copy())
    model.reset_lanes()
    return np.stack(out)


def bench_case(case: str, builds: dict[str, str], rng: np.random.Generator) -> dict:
    name, batch = case.split(":")
    cfg = model_config(name, int(batch))
    weights = gpu_weights(model_plan(cfg, sampling=False), int(batch))
    models = {}
    for label, root in builds.items():
        models[label] = Model(cfg, load(root, cfg, "cuda"), tvm.cuda(0), weights, sampling=False)
        models[label].capture()
    ids = rng.integers(0, cfg.model.vocab_size, (CHECK_STEPS, cfg.batch))
    traces = {label: logits_trace(m, ids) for label, m in models.items()}
    first = next(iter(traces.values()))
    row: dict = {"case": case, "check_steps": CHECK_STEPS}
    row["bit_identical"] = {label: bool(np.array_equal(t, first, equal_nan=True)) for label, t in traces.items()}
    scale = np.abs(first).max(-1, keepdims=True)
    row["max_rel_diff"] = {label: float((np.abs(t - first) / scale).max()) for label, t in traces.items()}
    row["finite"] = bool(np.isfinite(first).all())
    for m in models.values():
        start_lanes(m, rng, POSITION)
    times: dict[str, list[float]] = {label: [] for label in models}
    for _ in range(ROUNDS):
        for label, m in models.items():
            times[label].append(step_us(m))
    floor_us = floor_bytes(cfg, model_plan(cfg, sampling=False), POSITION)["total"] / (GPU.peak_gbps * 1e3)
    row["floor_us"] = round(floor_us, 1)
    row["builds"] = {}
    for label, root in builds.items():
        us = statistics.median(times[label])
        manifest = read_manifest(root, cfg, "cuda")[1]
        row["builds"][label] = {
            "programmatic_launch": manifest.get("programmatic_launch"),
            "us_per_token": round(us, 1),
            "rounds_us": [round(t, 1) for t in times[label]],
            "x_floor": round(us / floor_us, 3),
        }
    base = row["builds"][next(iter(builds))]["us_per_token"]
    for entry in row["builds"].values():
        entry["speedup"] = round(base / entry["us_per_token"], 3)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--builds", nargs="+", required=True, help="LABEL=ROOT (`--model` build roots; the first: base)")
    p.add_argument("--cases", nargs="+", default=["qwen3.5-0.8b:1", "qwen3.5-4b:1"], help="PRESET:BATCH")
    p.add_argument("--out", default="benchmarks/results/h200_launch_modes.json")
    args = p.parse_args(argv)
    builds = dict(b.split("=", 1) for b in args.builds)
    results = Results(args.out, "benchmarks.launch_modes", argv, max_len=MODEL_MAX_LEN, position=POSITION)
    rng = np.random.default_rng(0)
    for case in args.cases:
        try:
            row = bench_case(case, builds, rng)
        except Exception as err:  # a failed case is recorded; the run goes on
            row = {"case": case, "error": f"{type(err).__name__}: {err}"}
        results.add(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
