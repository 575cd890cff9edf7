"""The library GEMMs of prebuilt CUDA model builds on the GPU, with the TVM runtime alone: each `gemm_<proj>`
(cuBLAS, `runtime.cublas`; a stacked projection's into an output a part) after its `split_bf16_<width>`, and
`swiglu`, against the float64 reference on fresh random inputs, called eagerly and replayed in a CUDA graph; prints a
JSON line per op.

python -m benchmarks.library_check --library build/bench/model --cases qwen3.5-0.8b:32 qwen3.5-4b:128
(`benchmarks.prebuild --model` makes the builds.) A GEMM passes within 1e-4 relative with its split bit-exact.
"""

from __future__ import annotations

import argparse
import json

import ml_dtypes
import numpy as np
import tvm

from benchmarks.configs import model_config
from gdn_tvm.reference.gemm import gemm as gemm_reference
from gdn_tvm.reference.split_bf16 import split_bf16 as split_reference
from gdn_tvm.reference.swiglu import swiglu as swiglu_reference
from gdn_tvm.runtime.graph import CudaGraph
from gdn_tvm.runtime.module import load

TOL = 1e-4


def rel(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())


def nan_tensor(shape: tuple[int, ...], dtype, dev) -> tvm.runtime.Tensor:
    return tvm.runtime.tensor(np.full(shape, np.nan, dtype), dev)


def joined(ys: dict[str, tvm.runtime.Tensor]) -> np.ndarray:
    """The outputs side by side: the whole projection's [B, N]."""
    return np.concatenate([y.numpy() for y in ys.values()], axis=1)


def check_case(root: str, case: str, rng: np.random.Generator) -> None:
    name, batch = case.split(":")
    cfg = model_config(name, int(batch))
    kernels, dev, B = load(root, cfg, "cuda"), tvm.cuda(0), cfg.batch
    splits = {dict((a.name, a.shape) for a in k.signature)["x"][1]: n for n, k in kernels.items() if "split_bf16" in n}
    for op, kernel in kernels.items():
        if not op.startswith("gemm_"):
            continue
        N, K = next(a.shape for a in kernel.signature if a.name == "w")
        outs = [a for a in kernel.signature if a.role == "out"]  # y, or a stacked projection's parts
        split = kernels[splits[K]]
        x = rng.standard_normal((B, K)).astype(np.float32)
        w = (rng.standard_normal((N, K)) * K**-0.5).astype(ml_dtypes.bfloat16)
        xs_ref, refs = np.empty((2, B, K)), {a.name: np.empty(a.shape) for a in outs}
        split_reference(x.astype(np.float64), xs_ref)
        gemm_reference(w.astype(np.float64), xs_ref, **refs)
        y_ref = np.concatenate(list(refs.values()), axis=1)
        xt, wt = tvm.runtime.tensor(x, dev), tvm.runtime.tensor(w, dev)
        xs = nan_tensor((2, B, K), ml_dtypes.bfloat16, dev)
        ys = {a.name: nan_tensor(a.shape, np.float32, dev) for a in outs}
        split(x=xt, xs=xs)
        kernel(w=wt, xs=xs, **ys)
        dev.sync()
        exact = bool((xs.numpy().astype(np.float64) == xs_ref).all())
        eager = rel(joined(ys), y_ref)
        for a in outs:
            ys[a.name].copyfrom(np.full(a.shape, np.nan, np.float32))

        def step(split=split, kernel=kernel, xt=xt, wt=wt, xs=xs, ys=ys) -> None:
            split.launch({"x": xt, "xs": xs})
            kernel.launch({"w": wt, "xs": xs, **ys})

        graph = CudaGraph(step, 2)
        graph.replay()
        dev.sync()
        replayed = rel(joined(ys), y_ref)
        row = {"case": case, "op": op, "split": splits[K], "split_bit_exact": exact, "rel_err_eager": eager}
        product = x.astype(np.float64) @ w.astype(np.float64).T  # of float32 x: what the split keeps to ~4e-6
        row |= {"rel_err_graph": replayed, "rel_err_vs_float32_x": rel(joined(ys), product)}
        print(json.dumps(row | {"pass": exact and max(eager, replayed) <= TOL}), flush=True)
    if "swiglu" in kernels:
        width = cfg.model.intermediate_size
        x = rng.standard_normal((B, 2 * width)).astype(np.float32)
        y, ref = nan_tensor((B, width), np.float32, dev), np.empty((B, width))
        kernels["swiglu"](x=tvm.runtime.tensor(x, dev), y=y)
        dev.sync()
        swiglu_reference(x.astype(np.float64), ref)
        err = rel(y.numpy(), ref)
        print(json.dumps({"case": case, "op": "swiglu", "rel_err_eager": err, "pass": err <= TOL}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--library", required=True, help="build root of the model builds (`benchmarks.prebuild --model`)")
    p.add_argument("--cases", nargs="+", required=True, help="PRESET:BATCH, batched (library GEMMs from 4 lanes)")
    args = p.parse_args()
    rng = np.random.default_rng()
    for case in args.cases:
        check_case(args.library, case, rng)


if __name__ == "__main__":
    main()
