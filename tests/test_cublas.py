"""The library GEMMs' cuBLAS calls (`runtime.cublas`) checked without a GPU: the halves' sums of a stacked projection
replayed in numpy with cuBLAS's column-major `Sgeam` semantics over a scratch laid out as `cublasGemmEx` writes it."""

from __future__ import annotations

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
