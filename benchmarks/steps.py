"""Per-step latency of the runtime executor on the GPU: one GDN layer, one attention layer and a preset's whole
mixer stack, eager launches vs CUDA-graph replay vs a PyTorch step (checked against ours first, then timed eagerly
and graph-replayed), next to the weight-read floor and the floor of all the bytes a step must move (weights, plus
recurrent and conv states read and written and the KV rows read, per lane: what dominates from a few lanes on), each
counted in its storage dtype. Layer rows also time each launch of the plan alone. The storage dtypes are
`DecodeConfig`'s defaults (bf16 weights and KV) unless given; the PyTorch step then multiplies in bf16 (cuBLAS) and
attends over the bf16 cache, as engines do.

Each timed step is at the middle of the cache, after the steps before it were decoded (graph-replayed), so its
KV rows and states hold what decoding wrote.

python -m benchmarks.steps [--presets qwen3.5-0.8b qwen3.5-4b] [--batches 1 32] [--out FILE]
    [--weight-dtype D] [--kv-dtype D] [--state-dtype D]
Also checks that decoding does not allocate: device memory in use before and after 1000 graph-replayed steps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np
import torch
import tvm

from benchmarks import torch_ops
from benchmarks.configs import STEP_BATCHES, STEP_MAX_LEN, STEP_PRESETS, step_config
from benchmarks.record import Results
from benchmarks.run import GPU, build_compiler, kernels_for, library_kernels, schedule_summary
from benchmarks.timing import time_eager, time_graph, time_launch
from gdn_tvm.cli import add_dtype_arguments, dtypes
from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import step_ops
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.runtime.weights import unstack

# The PyTorch step multiplies in bf16 where the weights are bf16 (each GEMM input rounded to 8 bits) through every
# layer, where ours keeps float32 activations: it lands within a few percent of ours; a wrong one at order one.
BASELINE_TOL = 5e-2


class TorchStack:
    """The same mixer layers as PyTorch eager code over torch_ops (the same-run baseline)."""

    def __init__(self, stack: HybridStack):
        self.cfg, self.m = stack.cfg, stack.cfg.model
        self.layers = []
        for layer in stack.layers:
            w = unstack(self.m, {k: torch.from_dlpack(v) for k, v in layer.weights.items()})
            states = [torch.from_dlpack(s).clone() for s in layer.states]
            self.layers.append((layer.kind, w, states))

    def step(self, x: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, seq_len: int) -> torch.Tensor:
        m, B = self.m, self.cfg.batch
        for kind, w, st in self.layers:
            x = _gdn(m, B, w, st, x, slots) if kind == "gdn" else _attn(m, B, w, st, x, slots, positions, seq_len)
        return x


def _mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`x @ w^T` in w's dtype (cuBLAS bf16 for bf16 weights), float32 out."""
    return (x.to(w.dtype) @ w.t()).float()


def _gdn(m, B, w, st, x, slots):
    hv, dv = m.n_v_heads, m.head_v_dim
    mixed, z = _mm(x, w["in_proj_qkv"]), _mm(x, w["in_proj_z"]).view(B, hv, dv)
    b, a = _mm(x, w["in_proj_b"]), _mm(x, w["in_proj_a"])
    qkv, qk = torch.empty_like(mixed), torch.empty(B, 2 * m.n_k_heads, m.head_k_dim, device=x.device)
    g, beta, o, y = torch.empty_like(b), torch.empty_like(b), torch.empty_like(z), torch.empty_like(z)
    torch_ops.causal_conv1d_silu(m, mixed, w["conv1d"], st[0], slots, qkv)
    torch_ops.per_head_l2_norm(m, qkv, qk)
    torch_ops.gates(m, a, b, w["A"], w["dt_bias"], g, beta)
    torch_ops.delta_rule(m, qk, qkv, g, beta, st[1], slots, o)
    torch_ops.gated_rmsnorm(m, o, z, w["norm"], y)
    return _mm(y.view(B, -1), w["out_proj"])


def _attn(m, B, w, st, x, slots, positions, seq_len):
    hq, hkv, d = m.n_q_heads, m.n_kv_heads, m.head_dim
    qg = _mm(x, w["q_proj"]).view(B, hq, 2 * d)
    k, v = _mm(x, w["k_proj"]).view(B, hkv, d), _mm(x, w["v_proj"]).view(B, hkv, d)
    q, gate = torch.empty(B, hq, d, device=x.device), torch.empty(B, hq, d, device=x.device)
    torch_ops.split_interleaved(m, qg, q, gate)
    qn, kn, qr, kr = torch.empty_like(q), torch.empty_like(k), torch.empty_like(q), torch.empty_like(k)
    torch_ops.per_head_rmsnorm(m, q, k, w["q_norm"], w["k_norm"], qn, kn)
    torch_ops.partial_neox_rope(m, qn, kn, qr, kr, positions=positions)
    torch_ops.kv_row_scatter(m, kr, v, st[0], st[1], slots, positions=positions)
    attn = torch_ops.decode_attention(m, qr.to(st[0].dtype), st[0], st[1], slots, seq_len).float()
    return _mm((attn * torch.sigmoid(gate)).view(B, -1), w["o_proj"])


def _nbytes(t) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(str(t.dtype)).itemsize


def state_bytes(stack: HybridStack, position: int) -> int:
    """Per-lane state bytes a step moves, for every lane: GDN states read and written, K and V rows 0..position
    read (the one row written is left out)."""
    total = 0
    for layer in stack.layers:
        for state in layer.states:
            per_slot = _nbytes(state) // state.shape[0]
            total += 2 * per_slot if layer.kind == "gdn" else per_slot * (position + 1) // stack.cfg.max_len
    return total * stack.cfg.batch


def kernel_breakdown(stack: HybridStack) -> list[dict]:
    """Every launch of the step's plan timed alone on the step's own buffers (`timing.time_launch`): where a
    layer's time goes."""
    return [
        {"kernel": name, "us": round(time_launch(func, args), 2)}
        for layer in stack.layers
        for name, (func, args) in zip(layer.launched, layer.launches, strict=True)
    ]


def decode_until(stack: HybridStack, position: int) -> tuple[np.ndarray, np.ndarray]:
    """Every lane (slots 0..B-1) decodes positions 0..position-1 by graph replay (`capture()` first), so the caches
    and states hold what decoding wrote, then the step at `position` is written; returns its (x, slots)."""
    cfg = stack.cfg
    x = np.random.default_rng(0).standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
    slots = np.arange(cfg.batch, dtype=np.int32)
    for t in range(position):
        stack.step_graph(x, np.full(cfg.batch, t, np.int32), slots)
    stack.write_inputs(x, np.full(cfg.batch, position, np.int32), slots)
    return x, slots


def bench_torch(stack: HybridStack, x: np.ndarray, positions: np.ndarray, slots: np.ndarray, seq_len: int) -> dict:
    """The PyTorch step on copies of the stack's states and caches: its output checked against the executor's step
    from the same ones (its inputs as `decode_until` wrote them), then timed eagerly and graph-replayed. A baseline
    that does not match is not timed; one that raises is recorded (`torch_error`, `torch_graph_error`); so is one
    that cannot be checked because our output is all zero or not finite (a 24-layer mixer stack with random weights
    and no residuals decays to zero by about its ninth layer)."""
    try:
        ref = TorchStack(stack)
        tx, tpos, tslots = (torch.from_numpy(a).cuda() for a in (x, positions, slots))
        stack.run()
        ours = torch.from_dlpack(stack.out).double()
        theirs = ref.step(tx, tpos, tslots, seq_len).double()
        scale = float(ours.abs().max())
        if not 0 < scale < math.inf:  # a mixer-only stack has no residuals: random-weight activations can vanish
            return {"torch_error": f"unchecked: our step's output has largest magnitude {scale}, nothing to compare"}
        err = float((theirs - ours).abs().max()) / scale
        if not err <= BASELINE_TOL:  # NaN too
            return {"torch_error": f"wrong: {err:.2e} from ours (tolerance {BASELINE_TOL})"}

        def step(_: int) -> None:
            ref.step(tx, tpos, tslots, seq_len)

        row = {"torch_rel_err": float(f"{err:.3g}"), "torch_eager_us": round(time_eager(step, 1), 2)}
    except Exception as err:  # recorded; the run goes on
        return {"torch_error": f"failed: {type(err).__name__}: {err}"}
    try:
        row["torch_graph_us"] = round(time_graph(step, 1), 2)
    except Exception as err:
        row["torch_graph_error"] = f"failed: {type(err).__name__}: {err}"
    return row


def bench_stack(cfg: DecodeConfig, kernels: dict, types: tuple[str, ...], label: str) -> dict:
    dev = tvm.cuda(0)
    stack = HybridStack(cfg, kernels, dev, layer_types=types, seed=0)
    stack.capture()
    position = STEP_MAX_LEN // 2
    x, slots = decode_until(stack, position)
    pos = np.full(cfg.batch, position, np.int32)
    weight_bytes = sum(_nbytes(w) for layer in stack.layers for w in layer.weights.values())
    eager = time_eager(lambda _: stack.run(), 1)
    graph = time_eager(lambda _: stack.graph.replay(), 1)
    baseline = bench_torch(stack, x, pos, slots, position + 1)
    floor = weight_bytes / (GPU.peak_gbps * 1e3)
    moved = weight_bytes + state_bytes(stack, position)
    bytes_floor = moved / (GPU.peak_gbps * 1e3)
    row = {
        "what": label, "preset": cfg.model.name, "batch": cfg.batch, "layers": len(types),
        "eager_us": round(eager, 2), "graph_us": round(graph, 2), **baseline,
        "weight_bytes": weight_bytes, "weight_floor_us": round(floor, 2),
        "bytes_moved": moved, "bytes_floor_us": round(bytes_floor, 2),
        "graph_speedup_vs_eager": round(eager / graph, 2), "graph_vs_floor": round(graph / floor, 2),
        "graph_vs_bytes_floor": round(graph / bytes_floor, 2),
    }  # fmt: skip
    if label != "stack":
        row["kernels"] = kernel_breakdown(stack)
    else:
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        for t in range(1000):
            stack.step_graph(x, np.full(cfg.batch, t % STEP_MAX_LEN, np.int32), slots)
        dev.sync()
        row["device_free_bytes_before_after_1000_steps"] = [free0, torch.cuda.mem_get_info()[0]]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=list(STEP_PRESETS))
    p.add_argument("--batches", type=int, nargs="+", default=list(STEP_BATCHES))
    p.add_argument("--out", default="benchmarks/results/h200_steps.json")
    p.add_argument("--library", help="build root holding prebuilt CUDA modules for these configs (default: compile)")
    p.add_argument("--tuned", help="build root of tuned modules: used for the configs it holds (rows say which)")
    add_dtype_arguments(p)
    args = p.parse_args(argv)
    results = Results(
        args.out, "benchmarks.steps", argv, peak_gbps=GPU.peak_gbps, max_len=STEP_MAX_LEN, position=STEP_MAX_LEN // 2,
        dtypes=dtypes(args), baseline_tol=BASELINE_TOL,
    )  # fmt: skip
    for name in args.presets:
        for batch in args.batches:
            cfg = step_config(name, batch, **dtypes(args))
            kernels = library_kernels(args.tuned, cfg)
            schedules = schedule_summary(args.tuned, cfg) if kernels else "hand"
            compiler = build_compiler(args.tuned if kernels else args.library, cfg)
            kernels = kernels or kernels_for(cfg, step_ops(cfg), args.library)
            for label, types in (("gdn layer", ("gdn",)), ("attention layer", ("attention",)),
                                 ("stack", cfg.model.layer_types)):  # fmt: skip
                row = {**bench_stack(cfg, kernels, types, label), "schedules": schedules, "compiler": compiler}
                results.add(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
