"""`sample` on the GPU against PyTorch's sort-based sampler, per batch and sampling mode.

python -m benchmarks.sampling --library ROOT [--other LABEL=ROOT ...] [--batches 1 8 32 128] [--out FILE]
ROOT holds `python -m gdn_tvm.export --target cuda --allow-hand --ops sample --batch B --out ROOT/bB` builds (one
a batch; `--other` adds builds of other designs, e.g. an earlier commit's, as columns of their own). Modes: every
lane greedy; temperature 0.8 with top-k 50 and top-p 0.9; top-p 0.95 alone; plain temperature sampling. The logits
are spread as a trained model's (`peaked_logits`) over the 248,320-token vocabulary, each lane its own seed. Every
sampler is checked against the float64 reference on the same inputs (token ids exactly) before it is timed;
timing is graph replay on one input set (inside a decode step the LM head has just written the logits: L2-hot at
small B), median microseconds a call.

The PyTorch sampler is what engines fall back to without a sampling library (vLLM's native top-k/top-p path): sort
each row, the top-k threshold from the sorted values, the top-p threshold from a float64 cumulative sum of the
sorted candidates' weights, then the inverse CDF in index order at the same uniform number our kernel draws (its
Philox value computed on the host, outside the timing), one torch graph.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

from benchmarks.record import Results
from benchmarks.timing import time_graph
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.philox import uniform
from gdn_tvm.reference.sample import sample as reference
from gdn_tvm.runtime.module import load
from gdn_tvm.signature import bind, peaked_logits, poisoned, visible

PRESET = "qwen3.5-4b"  # the vocabulary (248,320) is every Qwen3.5's
MODES = {  # name -> (temperature, top_k, top_p)
    "greedy": (0.0, 0, 1.0),
    "top_k_top_p": (0.8, 50, 0.9),
    "top_p": (0.8, 0, 0.95),
    "plain": (1.0, 0, 1.0),
}


def lanes(cfg: DecodeConfig, mode: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The per-lane inputs of `sample` in `mode`: peaked logits, the mode's parameters, random seeds and steps."""
    B, V = cfg.batch, cfg.model.vocab_size
    t, k, p = MODES[mode]
    return {
        "logits": peaked_logits(rng, (B, V)),
        "temperature": np.full(B, t, np.float32),
        "top_k": np.full(B, k, np.int32),
        "top_p": np.full(B, p, np.float32),
        "seed": rng.integers(0, 2**62, B, dtype=np.int64),
        "step": rng.integers(0, 2**62, B, dtype=np.int64),
    }


def expected_tokens(values: dict[str, np.ndarray]) -> np.ndarray:
    tokens = np.zeros(len(values["seed"]), np.int32)
    reference(**{k: v.astype(np.float64) if k == "logits" else v for k, v in values.items()}, tokens=tokens)
    return tokens


class TorchSampler:
    """The sort-based sampler on torch tensors of one input set, the uniform numbers precomputed; `tokens` after a
    call."""

    def __init__(self, values: dict[str, np.ndarray]):
        self.logits = torch.from_numpy(values["logits"]).cuda()
        self.temperature = torch.from_numpy(values["temperature"]).cuda()[:, None]
        self.top_k = torch.from_numpy(values["top_k"]).cuda().long()[:, None]
        self.top_p = torch.from_numpy(values["top_p"]).cuda().double()[:, None]
        u = [uniform(s, t) for s, t in zip(values["seed"], values["step"], strict=True)]
        self.u = torch.tensor(u, dtype=torch.float64, device="cuda")[:, None]
        self.tokens = torch.zeros(len(u), dtype=torch.int64, device="cuda")

    def __call__(self) -> None:
        x, V = self.logits, self.logits.shape[1]
        greedy = x.argmax(dim=1)
        values, _ = x.sort(dim=1, descending=True)
        k = torch.where((self.top_k > 0) & (self.top_k < V), self.top_k, V)
        kept = x >= values.gather(1, k - 1)
        top = values[:, :1]
        sorted_w = torch.exp((values - top) / self.temperature).double() * (values >= values.gather(1, k - 1))
        mass = sorted_w.cumsum(dim=1)
        enough = (mass >= self.top_p * mass[:, -1:]).int().argmax(dim=1, keepdim=True)
        kept &= torch.where(self.top_p < 1, x >= values.gather(1, enough), True)
        cdf = torch.where(kept, torch.exp((x - top) / self.temperature).double(), 0.0).cumsum(dim=1)
        drawn = torch.searchsorted(cdf, self.u * cdf[:, -1:], right=True)[:, 0]
        last = V - 1 - kept.flip(1).int().argmax(dim=1)
        drawn = torch.where(drawn < V, drawn, last)
        self.tokens.copy_(torch.where(self.temperature[:, 0] > 0, drawn, greedy))


def ours(kernel, values: dict[str, np.ndarray]):
    """A call of `kernel` on device copies of `values`, its outputs and workspace poisoned; and the tokens tensor."""
    args = {
        a.name: torch.from_numpy(values[a.name] if a.name in values else poisoned(a)).cuda()
        for a in visible(kernel.signature)
    }
    bound = bind(kernel.signature, args)
    return (lambda: kernel.func(*bound)), args["tokens"]


def bench(label: str, call, tokens: torch.Tensor, expect: np.ndarray, row: dict) -> None:
    """Check `call`'s tokens against `expect`, then time it (a failure is recorded, not raised)."""
    try:
        call()
        torch.cuda.synchronize()
        got = tokens.cpu().numpy()
        if not np.array_equal(got, expect):
            row[f"{label}_error"] = f"wrong: tokens {got[:8].tolist()} against {expect[:8].tolist()}"
            return
        row[f"{label}_us"] = round(time_graph(lambda i: call(), 1), 2)
    except Exception as e:  # noqa: BLE001 - recorded: the JSON says why it did not run
        row[f"{label}_error"] = f"{type(e).__name__}: {e}"[:300]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--library", required=True, help="build root: ROOT/b<B> holds the sample build of batch B")
    p.add_argument("--other", nargs="*", default=[], help="LABEL=ROOT: another design's builds, laid out alike")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--out", default="benchmarks/results/h200_sampling.json")
    args = p.parse_args(argv)
    roots = {"tvm": args.library, **dict(o.split("=", 1) for o in args.other)}
    rng = np.random.default_rng()  # fresh inputs each run
    results = Results(args.out, "benchmarks.sampling", argv, preset=PRESET, modes=MODES)
    for B in args.batches:
        cfg = DecodeConfig(preset(PRESET), batch=B)
        kernels = {label: load(f"{root}/b{B}", cfg, "cuda")["sample"] for label, root in roots.items()}
        for mode in MODES:
            values = lanes(cfg, mode, rng)
            expect = expected_tokens(values)
            row: dict = {"batch": B, "mode": mode}
            for label, kernel in kernels.items():
                bench(label, *ours(kernel, values), expect, row)
            sampler = TorchSampler(values)
            bench("torch", sampler, sampler.tokens, expect, row)
            print(row, flush=True)
            results.add(row)
    results.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
