"""cuBLAS over an activation split into two bf16 rows against one bf16 row, at qwen3.5 GEMM shapes (a GPU and
PyTorch needed; no TVM): the measurement behind `plan.Fusions.library_gemm` (`runtime.cublas`).

python -m benchmarks.cublas_split [--cases PRESET:B ...] [--projections P ...] > cublas_split.jsonl
Per preset, lanes B and projection: median microseconds of `cublasGemmEx` (bf16 weights, float32 accumulation and
output; through ctypes, as the runtime calls it) on x rounded to bf16 ([B, K]) and on x split into high and low bf16
rows ([2B, K], the halves summed after), and of PyTorch's bf16 `linear` (cuBLAS, bf16 out), each graph-replayed over
enough weight copies that L2 does not hold them; the relative L-inf error of each against x @ w.T in float64.
"""

from __future__ import annotations

import argparse
import ctypes
import json

import torch

from gdn_tvm.config import preset
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", default=[f"{n}:{b}" for n, b in CASES], help="PRESET:B")
    p.add_argument("--projections", nargs="+", default=PROJECTIONS, help="`ModelConfig.projections` names")
    args = p.parse_args()
    gemm = _Gemm()
    for case in args.cases:
        name, batch = case.split(":")
        for proj in args.projections:
            print(json.dumps(measure(gemm, name, int(batch), proj)), flush=True)


if __name__ == "__main__":
    main()
