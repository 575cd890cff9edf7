"""Every registry op against its float64 reference on llvm, for every test case, and in bf16 where it reads a
storage dtype."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import (
    BF16_CASES,
    CASES,
    OnCuda,
    assert_kv_rows_round_to_nearest_even,
    check_op_against_reference,
    reads_dtype,
)

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.reference.activations import sigmoid, silu, softplus
from gdn_tvm.registry import OPS
from gdn_tvm.signature import ArgumentError, sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.verify import TOL_OP, mismatch


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", OPS)
def test_op_matches_reference(name, case, rng):
    check_op_against_reference(OPS[name], CASES[case], llvm(), rng)


@pytest.mark.parametrize(
    ("name", "case"), [(n, c) for c in BF16_CASES for n, op in OPS.items() if reads_dtype(op, BF16_CASES[c])]
)
def test_bf16_op_matches_reference(name, case, rng):
    """bf16 weights and caches in, float32 math: within `verify.TOLERANCES["bfloat16"]` of the reference, which
    rounds where the kernel stores (the KV scatter: bit for bit)."""
    check_op_against_reference(OPS[name], BF16_CASES[case], llvm(), rng)


def test_bf16_kv_rows_round_to_nearest_even(rng):
    cfg = BF16_CASES["4b-B3-bf16"]
    assert_kv_rows_round_to_nearest_even(compile_op(OPS["kv_row_scatter"], cfg, llvm()), cfg, rng)


def test_bf16_op_cases_cover_every_dtype_reader():
    """Every op whose PrimFunc reads a storage dtype is in the bf16 cases, and those read only weights or KV. (The
    library GEMMs and their splits hold bf16 whatever the config's dtypes: x's two rows.)"""
    cfg = BF16_CASES["0.8b-B1-bf16"]
    readers = {n for n, op in OPS.items() if reads_dtype(op, cfg)}
    fixed = {n for n, op in OPS.items() if op.family in ("split_bf16", "gemm")}
    assert readers == {n for n, op in OPS.items() if any(a.dtype == "bfloat16" for a in op.signature(cfg))} - fixed
    assert {
        "kv_row_scatter",
        "decode_attention",
        "per_head_rmsnorm",
        "add_rmsnorm",
        "rmsnorm",
        "gemv_out_proj_norm",
    } <= readers


@pytest.mark.parametrize("name", [n for n, op in OPS.items() if any(p.endswith("_eps") for p in op.ref_params)])
def test_norm_eps_comes_from_the_config(name, rng):
    """At a norm epsilon other than the presets' 1e-6 (`rms_norm_eps`, `l2_norm_eps`) the kernel matches its
    reference, and its outputs (but a copy: attention_prologue's gate) move away from those of the default-epsilon
    kernel on the same inputs."""
    op, cfg = OPS[name], CASES["0.8b-B1"]
    other = cfg.replace(**{p: 0.5 for p in op.ref_params if p.endswith("_eps")})
    check_op_against_reference(op, other, llvm(), rng)
    args = visible(op.signature(cfg))
    values = {a.name: sample(a, rng) for a in args}
    outs = []
    for c in (cfg, other):
        call = {k: np.copy(v) for k, v in values.items()}
        compile_op(op, c, llvm())(**call)
        outs.append(
            [call[a.name] for a in args if a.role == "out" and (name, a.name) != ("attention_prologue", "gate")]
        )
    for default, changed in zip(*outs, strict=True):
        assert mismatch(changed, default, TOL_OP), f"{name}: the epsilon changed no output"


def _misaligned(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A contiguous array whose data starts 4 bytes past a 16-byte boundary."""
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    buf = np.zeros(n + 32, np.uint8)
    start = -buf.ctypes.data % 16 + 4
    return buf[start : start + n].view(dtype).reshape(shape)


def _corruptions(args, cfg):
    """(arg name, bad value, message fragment) triples that a kernel must reject."""
    for a in args:
        if a.role == "index":
            lo, hi = a.bound
            yield a.name, np.full(a.shape, hi, np.int32), "outside"
            if a.slot_pool and a.shape[0] > 1:
                yield a.name, np.zeros(a.shape, np.int32), "distinct"
        elif a.role == "weight":
            yield a.name, "nan", "NaN"
        elif a.role == "in":
            yield a.name, np.zeros(a.shape, np.float64 if a.dtype != "float64" else np.float32), "dtype"
            yield a.name, np.zeros(a.shape[:-1] + (a.shape[-1] + 1,), a.dtype), "shape"
            yield a.name, np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)[..., ::2], "contiguous"
            yield a.name, _misaligned(a.shape, a.dtype), "aligned"
            yield a.name, np.zeros(a.shape, a.dtype).view(OnCuda), "cuda:0"


@pytest.mark.parametrize("name", OPS)
def test_bad_input_rejected_by_name_and_state_untouched(name, rng):
    op, cfg = OPS[name], CASES["4b-B3"]
    kernel = compile_op(op, cfg, llvm())
    args = visible(op.signature(cfg))
    cases = list(_corruptions(args, cfg))
    assert cases, f"{name}: nothing to corrupt"
    for arg_name, bad, fragment in cases:
        values = {a.name: sample(a, rng) for a in args}
        if isinstance(bad, str):
            bad = values[arg_name].copy()
            bad.flat[0] = np.nan
        before = {a.name: np.copy(values[a.name]) for a in args if a.role in ("state", "out")}
        with pytest.raises(ArgumentError, match=f"{arg_name}.*{fragment}|{fragment}.*{arg_name}"):
            kernel(**(values | {arg_name: bad}))
        for k, v in before.items():
            assert np.array_equal(values[k], v, equal_nan=True), f"{name}: {k} changed by a rejected call"


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_reference_activations_never_overflow(dtype):
    """The references' sigmoid, SiLU and softplus at any input: the textbook forms where those are finite, limits
    beyond, and no overflow (a float32 baseline check once hit exp(-x) = inf)."""
    x = np.array([-1000.0, -90.0, -1.5, 0.0, 2.0, 25.0, 1000.0], dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        s, y, sp = sigmoid(x), silu(x), softplus(x)
    inner = x[2:-2].astype(np.float64)
    np.testing.assert_allclose(s[2:-2], 1.0 / (1.0 + np.exp(-inner)), rtol=1e-6 if dtype == np.float32 else 1e-15)
    np.testing.assert_allclose(y[2:-2], inner / (1.0 + np.exp(-inner)), rtol=1e-6 if dtype == np.float32 else 1e-15)
    assert s[0] == 0.0 and s[-1] == 1.0 and y[0] == 0.0 and y[-1] == x[-1]
    assert sp[-1] == x[-1] and sp[0] == 0.0 and sp.dtype == dtype
