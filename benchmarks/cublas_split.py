"""cuBLAS over an activation split into two bf16 rows against one bf16 row, at qwen3.5 GEMM shapes (a GPU and
PyTorch needed; no TVM): the measurement behind `plan.Fusions.library_gemm` (`runtime.cublas`).

python -m benchmarks.cublas_split [--cases PRESET:B ...] [--projections P ...] [--grouped] > cublas_split.jsonl
Per preset, lanes B and projection: median microseconds of `cublasGemmEx` (bf16 weights, float32 accumulation and
output; through ctypes, as the runtime calls it) on x rounded to bf16 ([B, K]) and on x split into high and low bf16
rows ([2B, K], the halves summed after), and of PyTorch's bf16 `linear` (cuBLAS, bf16 out), each graph-replayed over
enough weight copies that L2 does not hold them; the relative L-inf error of each against x @ w.T in float64.
`--grouped`: also each `STACKED` projection's parts as one `cublasGemmGroupedBatchedEx` call on the split rows, one
group a part, each into an output of its own (`grouped_us`, `err_grouped`), beside the stacked weight's one GEMM.
"""

from __future__ import annotations

import argparse
import ctypes
import json

import torch

from gdn_tvm.config import STACKED, preset
from gdn_tvm.runtime import cublas

CASES = [("qwen3.5-4b", b) for b in (8, 16, 32, 128, 256)] + [("qwen3.5-0.8b", b) for b in (8, 32, 128)]
PROJECTIONS = ("in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "k_proj", "gate_up_proj", "down_proj", "lm_head")
ROTATE_BYTES = 256e6  # weight copies a timing cycles through: more than L2 holds
PEAK = 4.3e12


class _Gemm:
    """`cublasGemmEx` through ctypes on torch's current stream, with a workspace of its own (graph capture)."""

    def __init__(self):
        self.lib = cublas.library()
        self.handle = ctypes.c_void_p()
        assert self.lib.cublasCreate_v2(ctypes.byref(self.handle)) == 0
        self.workspace = torch.empty(cublas.WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")

    def bind(self) -> None:
        stream = torch.cuda.current_stream().cuda_stream
        cublas.use_stream(self.lib, self.handle, stream, self.workspace.data_ptr())

    def __call__(self, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
        """y [rows, N] float32 = x [rows, K] bf16 @ w [N, K] bf16 .T"""
        (n, k), rows = w.shape, x.shape[0]
        cublas.gemm_ex(self.lib, self.handle, w.data_ptr(), x.data_ptr(), y.data_ptr(), n, rows, k)


def replayed_us(gemm: _Gemm, run, copies: int) -> float:
    """Median microseconds of `run()` (over `copies` weights) replayed in a torch CUDA graph, per weight."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        gemm.bind()
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            gemm.bind()
            run()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / copies)
    return sorted(times)[len(times) // 2]


def measure(gemm: _Gemm, name: str, batch: int, proj: str) -> dict:
    n, k = preset(name).projections[proj]
    copies = max(1, min(8, int(ROTATE_BYTES // (n * k * 2))))
    ws = [(torch.randn(n, k, device="cuda") * k**-0.5).bfloat16() for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda")
    exact = x.double() @ ws[0].double().T
    hi = x.bfloat16()
    split = torch.cat([hi, (x - hi.float()).bfloat16()])
    one_row = torch.full((batch, n), float("nan"), device="cuda")
    two_rows = torch.full((2 * batch, n), float("nan"), device="cuda")
    gemm.bind()
    gemm(ws[0], hi, one_row)
    gemm(ws[0], split, two_rows)
    torch.cuda.synchronize()
    scale = exact.abs().max().item()
    row = {"preset": name, "B": batch, "op": proj, "N": n, "K": k, "floor_us": round(n * k * 2 / PEAK * 1e6, 2)}
    # checked before timing: the timed runs cycle through the weight copies, leaving the last one's product
    for key, y in (("bf16x", one_row), ("hilo", two_rows[:batch] + two_rows[batch:])):
        row[f"err_{key}"] = ((y.double() - exact).abs().max() / scale).item()
    row["err_torch"] = ((torch.nn.functional.linear(hi, ws[0]).double() - exact).abs().max() / scale).item()
    row["bf16x_us"] = round(replayed_us(gemm, lambda: [gemm(w, hi, one_row) for w in ws], copies), 2)
    row["hilo_us"] = round(replayed_us(gemm, lambda: [gemm(w, split, two_rows) for w in ws], copies), 2)
    torch_run = lambda: [torch.nn.functional.linear(hi, w) for w in ws]  # noqa: E731
    row["torch_bf16_us"] = round(replayed_us(gemm, torch_run, copies), 2)
    return row


def grouped(gemm: _Gemm, name: str, batch: int, stack: str) -> dict:
    """The parts of `stack` as one grouped GEMM over x split into two bf16 rows (a group a part, every part's
    product into an output of its own), checked against float64, then timed like `measure`."""
    m = preset(name)
    shapes = [m.projections[part] for part in STACKED[stack]]
    k = shapes[0][1]
    total = sum(n * k * 2 for n, _ in shapes)
    copies = max(1, min(8, int(ROTATE_BYTES // total)))
    ws = [[(torch.randn(n, k, device="cuda") * k**-0.5).bfloat16() for n, _ in shapes] for _ in range(copies)]
    x = torch.randn(batch, k, device="cuda")
    hi = x.bfloat16()
    split = torch.cat([hi, (x - hi.float()).bfloat16()])
    outs = [torch.full((2 * batch, n), float("nan"), device="cuda") for n, _ in shapes]
    g = len(shapes)
    ints = lambda values: (ctypes.c_int * g)(*values)  # noqa: E731
    fixed = (ints([cublas.OP_T] * g), ints([cublas.OP_N] * g), ints([n for n, _ in shapes]), ints([2 * batch] * g))
    fixed += (ints([k] * g), (ctypes.c_float * g)(*[1.0] * g))
    pointers = [
        [
            torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64, device="cuda")
            for tensors in (w, [split] * g, outs)
        ]
        for w in ws
    ]
    zeros = (ctypes.c_float * g)(*[0.0] * g)

    def call(a, b, c) -> None:
        ta, tb, ms, ns, ks, alpha = fixed
        status = gemm.lib.cublasGemmGroupedBatchedEx(
            gemm.handle, ta, tb, ms, ns, ks, alpha, ctypes.c_void_p(a.data_ptr()), cublas.R_16BF, ks,
            ctypes.c_void_p(b.data_ptr()), cublas.R_16BF, ks, zeros, ctypes.c_void_p(c.data_ptr()), cublas.R_32F, ms,
            g, ints([1] * g), cublas.COMPUTE_32F,
        )  # fmt: skip
        assert status == 0, f"cublasGemmGroupedBatchedEx: status {status}"

    gemm.bind()
    call(*pointers[0])
    torch.cuda.synchronize()
    err = 0.0
    for w, y in zip(ws[0], outs, strict=True):
        exact = x.double() @ w.double().T
        got = y[:batch].double() + y[batch:].double()
        err = max(err, ((got - exact).abs().max() / exact.abs().max()).item())
    row = {"preset": name, "B": batch, "op": f"grouped:{stack}", "N": sum(n for n, _ in shapes), "K": k}
    row["err_grouped"] = err
    row["grouped_us"] = round(replayed_us(gemm, lambda: [call(*p) for p in pointers], copies), 2)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=[f"{n}:{b}" for n, b in CASES], help="PRESET:B")
    p.add_argument("--projections", nargs="+", default=PROJECTIONS, help="`ModelConfig.projections` names")
    p.add_argument("--grouped", action="store_true", help="also each STACKED projection as one grouped GEMM")
    args = p.parse_args()
    gemm = _Gemm()
    for case in args.cases:
        name, batch = case.split(":")
        for proj in args.projections:
            print(json.dumps(measure(gemm, name, int(batch), proj)), flush=True)
        for stack in STACKED if args.grouped else ():
            try:
                row = grouped(gemm, name, int(batch), stack)
            except Exception as err:  # recorded; the run goes on
                row = {
                    "preset": name,
                    "B": int(batch),
                    "op": f"grouped:{stack}",
                    "error": f"{type(err).__name__}: {err}",
                }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
