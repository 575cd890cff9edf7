"""The whole model's decode step on the GPU (`runtime.model.Model`): milliseconds per token and tokens/s,
graph-replayed, next to the step's byte floor and the PyTorch + fla model (`benchmarks.torch_model`, checked against
ours first) in the same run; what a caller of `generate` sees per token against the replay; device
memory over a long generation. bf16 weights and KV cache, float32 recurrent states; random weights made on the GPU;
greedy decoding (`Model(sampling=False)`: `argmax` picks the tokens).

python -m benchmarks.model [--cases qwen3.5-0.8b:1 qwen3.5-4b:32 ...] [--library ROOT] [--library-lanes N]
    [--breakdown B ...] [--out FILE]
With `--library` (`benchmarks.prebuild --model`) it needs only the TVM runtime: nothing here imports the compiler.
Each timed step has every lane at position `POSITION` of `MODEL_MAX_LEN` (the prompt's tokens fed, so no lane finishes).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import ml_dtypes  # noqa: F401  (numpy's bfloat16)
import numpy as np
import torch
import tvm

from benchmarks.configs import MODEL_CASES, MODEL_MAX_LEN, model_config, set_library_lanes
from benchmarks.record import Results
from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import Plan, fusions
from gdn_tvm.plan import model as model_plan
from gdn_tvm.runtime.graph import CudaGraph
from gdn_tvm.runtime.model import Model, Request
from gdn_tvm.target import DEFAULT_GPU as GPU

POSITION = MODEL_MAX_LEN // 2
REPEATS, STEPS = 25, 8  # medians of REPEATS timings of STEPS replays (positions move on by REPEATS * STEPS)
CHECK_STEPS = 4  # steps from zero states on which the baseline's logits are checked against ours
# The baseline runs bf16 activations: each GEMM input, norm output and residual branch rounded to 8 bits (2^-9
# relative) through every layer, where ours stay float32; its logits land within a few percent of ours, and a wrong
# baseline (a swapped argument, a missed norm) lands at order one.
BASELINE_TOL = 5e-2
GENERATED = 512  # tokens a `generate` run decodes per lane
LONG_RUN = 10_000  # tokens of the memory check (B = 1)
BREAKDOWN_BATCHES = (1, 128)  # batches whose rows also time each op of the step alone (default of --breakdown)


def gpu_weights(plan: Plan, seed: int) -> dict[str, torch.Tensor]:
    """Random weights for `plan` made on the GPU in their stored dtypes, scaled like `runtime.weights`' random ones
    (making a 4b model's on the host takes a minute)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name, buffer in plan.weights.items():
        base, shape = name.rsplit(".", 1)[-1], buffer.shape
        u = torch.rand(shape, generator=gen, device="cuda")
        if base == "A":
            w = -torch.exp(u * math.log(16.0))
        elif base == "dt_bias":
            dt = torch.exp(math.log(1e-3) + u * (math.log(1e-1) - math.log(1e-3)))
            w = dt + torch.log(-torch.expm1(-dt))
        elif len(shape) == 1:  # norms: the gated one multiplies by w, the others by 1 + w
            w = (1.0 if base == "norm" and name != "norm" else 0.0) + 0.1 * torch.randn(
                shape, generator=gen, device="cuda"
            )
        else:
            w = torch.randn(shape, generator=gen, device="cuda")
            if base != "embed_tokens":
                w *= shape[-1] ** -0.5
        out[name] = w.to(getattr(torch, buffer.dtype))
    return out


def floor_bytes(cfg: DecodeConfig, plan: Plan, position: int) -> dict[str, int]:
    """The bytes a step must move: every weight once (the embedding table as B rows, unless the LM head reads all of
    it), recurrent and conv states read and written, the KV rows up to `position` read and one row written, per
    lane."""
    m, B = cfg.model, cfg.batch
    weights = 0
    for name, w in plan.weights.items():
        size = math.prod(w.shape) * np.dtype(w.dtype).itemsize
        if name == "embed_tokens" and not m.tie_word_embeddings:
            size = B * m.hidden * 2
        weights += size
    kinds = m.layer_types
    gdn, attn = kinds.count("gdn"), kinds.count("attention")
    state = 4 * (m.n_v_heads * m.head_v_dim * m.head_k_dim + m.conv_dim * (m.conv_kernel - 1))
    kv_row = 2 * m.n_kv_heads * m.head_dim * 2  # K and V, bf16
    states = B * gdn * 2 * state
    kv = B * attn * kv_row * (position + 2)  # rows 0..position read, the new one written
    return {"weights": weights, "states": states, "kv": kv, "total": weights + states + kv}


def start_lanes(model: Model, rng: np.random.Generator, position: int) -> None:
    """Every lane live at `position`: prompts as long as the cache (each step feeds a prompt token, none emits)."""
    cfg = model.cfg
    for _ in range(cfg.batch):
        model.start(Request(rng.integers(0, cfg.model.vocab_size, cfg.max_len).tolist(), 1))
    model.inputs["positions"].copyfrom(np.full(cfg.batch, position, np.int32))


def step_us(model: Model) -> float:
    """Median microseconds of a replayed step (REPEATS timings of STEPS back-to-back replays)."""
    model.elapsed(STEPS)  # warm
    return statistics.median(model.elapsed(STEPS) / STEPS * 1e6 for _ in range(REPEATS))


def generate_us(model: Model, rng: np.random.Generator) -> tuple[float, float]:
    """Wall microseconds per decoded token of `generate` (B one-token prompts, GENERATED tokens each, greedy) and of a
    replayed step at the middle of that run."""
    cfg = model.cfg
    requests = [Request([int(rng.integers(cfg.model.vocab_size))], GENERATED) for _ in range(cfg.batch)]
    arrivals: list[float] = []
    model.generate(requests, lambda index, token: arrivals.append(time.perf_counter()))
    steps = GENERATED - 1
    wall = (arrivals[-1] - arrivals[cfg.batch - 1]) / steps * 1e6  # from the first step's tokens to the last's
    start_lanes(model, rng, GENERATED // 2)
    replay = step_us(model)
    model.reset_lanes()
    return wall, replay


def memory_flat(name: str, kernels_for, rng: np.random.Generator) -> dict:
    """Free device memory before and after LONG_RUN tokens generated at B = 1 (requests of MODEL_MAX_LEN - 1 tokens,
    one after another on the same model)."""
    cfg = model_config(name, 1)
    model = Model(cfg, kernels_for(cfg), tvm.cuda(0), gpu_weights(model_plan(cfg), 1), sampling=False)
    model.capture()
    model.generate([Request([1], 16)])
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    budget = cfg.max_len - 1
    out = model.generate([Request([1], budget)] * -(-LONG_RUN // budget))
    torch.cuda.synchronize()
    free_after = torch.cuda.mem_get_info()[0]
    return {"case": f"{name}:1", "generated": sum(map(len, out)), "device_bytes_freed": free_after - free_before}


def breakdown(model: Model) -> dict[str, float]:
    """Microseconds a step spends in each op: every bound launch timed alone (a CUDA graph of STEPS copies of it, on
    the step's own buffers), summed by op, largest first."""
    per_op: dict[str, float] = {}
    for name, (func, args) in zip(model.bound.launched, model.bound.launches, strict=True):
        graph = CudaGraph(lambda func=func, args=args: [func(*args) for _ in range(STEPS)], STEPS)
        graph.replay()
        us = statistics.median(graph.elapsed(1) for _ in range(5)) * 1e6 / STEPS
        per_op[name] = per_op.get(name, 0.0) + us
    return {name: round(us, 2) for name, us in sorted(per_op.items(), key=lambda kv: -kv[1])}


def check_baseline(model: Model, baseline, rng: np.random.Generator) -> float:
    """The largest relative L-inf distance, over lanes and CHECK_STEPS steps from zero states on the same tokens,
    between the baseline's logits and ours."""
    cfg = model.cfg
    ids = rng.integers(0, cfg.model.vocab_size, (CHECK_STEPS, cfg.batch))
    for lane in range(cfg.batch):  # slots 0..B-1 in lane order, as the baseline has them; every step a prompt token
        model.start(Request([*ids[:, lane].tolist(), 0], 1))
    worst = 0.0
    for t in range(CHECK_STEPS):
        model.events(model.launch())
        ours = model.logits.numpy().astype(np.float64)
        theirs = baseline.step(torch.from_numpy(ids[t]).cuda(), t).double().cpu().numpy()
        worst = max(worst, float((np.abs(theirs - ours).max(1) / np.abs(ours).max(1)).max()))
    model.reset_lanes()
    return worst


def baseline_us(baseline, cfg: DecodeConfig, rng: np.random.Generator) -> float:
    """Median microseconds of the baseline's step at POSITION and its greedy token (`argmax`: ours samples on the
    device too), captured as one torch CUDA graph and replayed."""
    ids = torch.from_numpy(rng.integers(0, cfg.model.vocab_size, cfg.batch)).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        baseline.step(ids, POSITION).argmax(-1)  # warm-up (Triton compiles here)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        baseline.step(ids, POSITION).argmax(-1)
    times = []
    for _ in range(REPEATS + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(STEPS):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / STEPS)
    return statistics.median(times[1:])


def bench_baseline(model: Model, weights: dict, rng: np.random.Generator) -> dict:
    """The PyTorch + fla model on the same weights: checked against ours, then timed; a failure is recorded."""
    from benchmarks.torch_model import TorchModel

    try:
        baseline = TorchModel(model.cfg, weights)
        err = check_baseline(model, baseline, rng)
        if err > BASELINE_TOL:
            return {"torch_fla_error": f"wrong: logits {err:.2e} from ours (tolerance {BASELINE_TOL})"}
        us = baseline_us(baseline, model.cfg, rng)
        return {"torch_fla_ms": round(us / 1e3, 4), "torch_fla_rel_err": float(f"{err:.3g}")}
    except Exception as err:  # recorded; the run goes on
        model.reset_lanes()
        return {"torch_fla_error": f"failed: {type(err).__name__}: {err}"}
    finally:
        torch.cuda.empty_cache()


def bench_case(name: str, batch: int, kernels_for, rng: np.random.Generator, by_op: bool) -> dict:
    cfg = model_config(name, batch)
    plan = model_plan(cfg, sampling=False)
    weights = gpu_weights(plan, batch)
    model = Model(cfg, kernels_for(cfg), tvm.cuda(0), weights, sampling=False)
    model.capture()
    versus = bench_baseline(model, weights, rng)
    start_lanes(model, rng, POSITION)
    us = step_us(model)
    per_op = breakdown(model) if by_op else {}
    model.reset_lanes()
    floor = floor_bytes(cfg, plan, POSITION)
    floor_us = floor["total"] / (GPU.peak_gbps * 1e3)
    row = {
        "case": f"{name}:{batch}",
        "launches": len(plan.launches),
        "library_gemm": sorted(fusions(cfg).library_gemm),
        "ms_per_token": round(us / 1e3, 4),
        "tokens_per_s": round(batch / us * 1e6, 1),
        "floor_bytes": floor,
        "floor_ms": round(floor_us / 1e3, 4),
        "x_floor": round(us / floor_us, 3),
        "pct_of_peak": round(100 * floor_us / us, 1),
        **versus,
        **({"us_by_op": per_op} if per_op else {}),
    }
    if "torch_fla_ms" in versus:
        row["speedup_vs_torch_fla"] = round(versus["torch_fla_ms"] * 1e3 / us, 3)
    if batch == 1:
        wall, replay = generate_us(model, rng)
        row |= {"generate_us_per_token": round(wall, 2), "replay_us_mid_generate": round(replay, 2)}
        row["generate_over_replay"] = round(wall / replay, 3)
    return row


def compiler(library: str | None, cfg: DecodeConfig) -> str:
    """The CUDA compiler of `cfg`'s kernels: its build's under `library`, else this machine's (they compile here)."""
    if library:
        from gdn_tvm.runtime.module import read_manifest

        return read_manifest(library, cfg, "cuda")[1].get("cuda_compile", "unknown")
    from gdn_tvm.codegen.library import cuda_compiler

    return cuda_compiler()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=MODEL_CASES, help="PRESET:BATCH")
    p.add_argument("--library", help="build root holding the model's CUDA builds (default: compile here)")
    p.add_argument("--memory", default="qwen3.5-0.8b", help="preset of the long-run memory check ('' skips it)")
    p.add_argument("--breakdown", nargs="*", type=int, default=BREAKDOWN_BATCHES, help="batches timed op by op")
    p.add_argument("--library-lanes", type=int, help="library GEMMs from N lanes (as the builds were made with)")
    p.add_argument("--out", default="benchmarks/results/h200_model.json")
    args = p.parse_args(argv)
    set_library_lanes(args.library_lanes)

    def kernels_for(cfg: DecodeConfig):
        if args.library:
            from gdn_tvm.runtime.module import load

            return load(args.library, cfg, "cuda")
        from gdn_tvm.codegen.compile import build_kernels
        from gdn_tvm.target import cuda

        return build_kernels(cfg, cuda(), model_plan(cfg, sampling=False).ops)

    results = Results(
        args.out, "benchmarks.model", argv, peak_gbps=GPU.peak_gbps, max_len=MODEL_MAX_LEN, position=POSITION,
        dtypes={"weight": "bfloat16", "kv": "bfloat16", "state": "float32"},
    )  # fmt: skip
    rng = np.random.default_rng(0)
    for case in args.cases:
        name, batch = case.split(":")
        try:
            row = bench_case(name, int(batch), kernels_for, rng, int(batch) in args.breakdown)
            row["compiler"] = compiler(args.library, model_config(name, int(batch)))
        except Exception as err:  # a failed case is recorded; the run goes on
            row = {"case": case, "error": f"{type(err).__name__}: {err}"}
        results.add(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    if args.memory:
        row = memory_flat(args.memory, kernels_for, rng)
        results.add(row)
        print(json.dumps(row), flush=True)
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
