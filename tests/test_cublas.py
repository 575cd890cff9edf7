"""The library GEMMs' cuBLAS calls (`runtime.cublas`) checked without a GPU: the halves' sums of a stacked projection
replayed in numpy with cuBLAS's column-major `Sgeam` semantics over a scratch laid out as `cublasGemmEx` writes it,
and a GEMM's function issuing them over a scratch it keeps alive (against a recording stand-in for the library)."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest

from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.ops.gemm import signature
from gdn_tvm.runtime import cublas


def sgeam(flat: np.ndarray, op: cublas.Sgeam) -> np.ndarray:
    """`C = A + B` as cublasSgeam computes it (column-major, element (i, j) of A at `hi + i + j * ld`), returned as the
    row-major `[cols, rows]` output its leading dimension `rows` makes of C."""
    i, j = np.meshgrid(np.arange(op.rows), np.arange(op.cols), indexing="ij")
    c = flat[op.hi + i + j * op.ld] + flat[op.lo + i + j * op.ld]
    return c.T


@pytest.mark.parametrize("proj", ["in_proj", "qkv_proj", "in_proj_b", "lm_head"])
def test_sgeams_sum_each_outputs_columns_of_both_halves(proj, rng):
    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=3)
    args = signature(cfg, proj)
    (n, _), outs = args[0].shape, [a for a in args if a.role == "out"]
    scratch = rng.standard_normal((2, cfg.batch, n))  # [hi | lo] rows, as cublasGemmEx writes [2B, N] row-major
    whole = scratch[0] + scratch[1]
    ops = cublas.sgeams(cfg.batch, n, [a.shape[1] for a in outs])
    start = 0
    for out, op in zip(outs, ops, strict=True):
        got = sgeam(scratch.reshape(-1), op)
        assert got.shape == out.shape
        np.testing.assert_array_equal(got, whole[:, start : start + out.shape[1]])
        start += out.shape[1]
    assert start == n


@pytest.mark.parametrize("widths", [[6, 3], [10, 0], []])
def test_outputs_that_do_not_cover_the_weight_are_refused(widths):
    with pytest.raises(ValueError, match="do not cover the weight's 10 rows"):
        cublas.sgeams(2, 10, widths)


class _Buffer:
    """A device tensor as the GEMM function sees it: an address (and, unlike an int, a lifetime)."""

    def __init__(self, address: int):
        self.address = address

    def data_ptr(self) -> int:
        return self.address


class _Library:
    """cuBLAS's two entry points a GEMM calls, recording their arguments."""

    def __init__(self):
        self.calls: list[tuple[str, tuple]] = []

    def cublasGemmEx(self, *args) -> int:
        self.calls.append(("gemm", args))
        return 0

    def cublasSgeam(self, *args) -> int:
        self.calls.append(("sgeam", args))
        return 0


class _Handle:
    def __init__(self):
        self.lib, self.handle, self.lock = _Library(), None, threading.Lock()

    def on_current_stream(self) -> None:
        pass


SCRATCH = 1 << 32


def test_a_gemm_function_keeps_its_scratch_and_writes_it(monkeypatch):
    """The scratch lives as long as the function (9bd218d kept its address only: the tensor was freed, and the H200
    faulted in every library GEMM), GemmEx writes it and each Sgeam reads its columns of both halves."""
    handle, made = _Handle(), []
    monkeypatch.setattr(cublas._Handle, "of", lambda _device: handle)
    monkeypatch.setattr(cublas.tvm.runtime, "empty", lambda *_args: made.append(_Buffer(SCRATCH)) or made[-1])
    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=3)
    args = signature(cfg, "in_proj")
    gemm = cublas.gemm_kernel(args, (2, 0))
    scratch = weakref.ref(made.pop())
    gc.collect()
    assert scratch() is not None
    outs = [a for a in args if a.role == "out"]
    gemm(_Buffer(1 << 40), _Buffer(2 << 40), *(_Buffer((3 + i) << 40) for i in range(len(outs))))
    (kind, gemm_args), *sums = handle.lib.calls
    assert kind == "gemm" and gemm_args[14].value == SCRATCH
    ops = cublas.sgeams(cfg.batch, args[0].shape[0], [a.shape[1] for a in outs])
    for (kind, call), op, i in zip(sums, ops, range(len(outs)), strict=True):
        assert kind == "sgeam" and (call[6].value, call[9].value) == (SCRATCH + 4 * op.hi, SCRATCH + 4 * op.lo)
        assert call[11].value == (3 + i) << 40
    del gemm
    gc.collect()
    assert scratch() is None
