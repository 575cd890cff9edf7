"""Shared test pieces: the case table, fresh seeded RNG, the one comparison helper, a build cache."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import tvm

from gdn_tvm.build.compile import compile_op
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.signature import sample, visible

# Per-op and per-layer tolerances (SPEC.md numerics contract): relative L-infinity.
TOL_OP = 1e-4
TOL_LAYER = 1e-3

# Two presets with Hv != Hk among them, B = 1 and B = 3 (4 slots, one lane skipped), a scaled-down cache.
CASES = {
    "0.8b-B1": DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=80, split_len=16),
    "4b-B3": DecodeConfig(preset("qwen3.5-4b"), batch=3, slots=4, max_len=80, split_len=16),
    "4b-B1-tiled": DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=48, split_len=32).replace(head_mapping="tiled"),
    "27b-B3-tiled": DecodeConfig(preset("qwen3.5-27b"), batch=3, slots=5, max_len=40, split_len=16).replace(
        head_mapping="tiled"
    ),
}


def pytest_report_header(config):
    return f"gdn_tvm seed: {_SEED} (set GDN_TVM_SEED to replay)"


_SEED = int(os.environ.get("GDN_TVM_SEED", np.random.SeedSequence().entropy % 2**32))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A fresh generator per test, derived from the run's seed and the test id (replayable)."""
    return np.random.default_rng([_SEED, zlib.crc32(request.node.nodeid.encode())])


def assert_close(out: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    """Relative L-infinity `max|out - ref| / max|ref| <= tol`; NaN only (and exactly) where ref is NaN.

    `tol == 0` demands bit-identical values.
    """
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape, f"{what}: shape {out.shape} != {ref.shape}"
    ref_nan = np.isnan(ref)
    out_nan = np.isnan(out)
    assert (out_nan == ref_nan).all(), (
        f"{what}: {int((out_nan & ~ref_nan).sum())} unwritten/NaN elements, "
        f"{int((ref_nan & ~out_nan).sum())} written where they must stay untouched"
    )
    if tol == 0:
        diff = np.flatnonzero((out != ref) & ~ref_nan)
        assert diff.size == 0, f"{what}: {diff.size} elements differ (first at flat index {diff[0]})"
        return
    o, r = out[~ref_nan].astype(np.float64), ref[~ref_nan].astype(np.float64)
    scale = np.abs(r).max() if r.size else 0.0
    assert scale > 0, f"{what}: reference is all zeros; the test draws no signal"
    err = np.abs(o - r).max() / scale
    assert err <= tol, f"{what}: relative L-inf error {err:.3e} > {tol:.0e}"


def check_op_against_reference(op, cfg, target, rng) -> None:
    """Build `op`'s hand schedule for `target` and check it with `check_kernel_against_reference`."""
    check_kernel_against_reference(op, cfg, compile_op(op, cfg, target), rng)


def check_kernel_against_reference(op, cfg, kernel, rng) -> None:
    """Run a compiled kernel of `op` on fresh inputs (outputs NaN-poisoned) on its device and compare every
    output and state with the float64 reference (bit for bit for data movement)."""
    device = tvm.device(*kernel.device)
    args = visible(op.signature(cfg))
    values = {a.name: sample(a, rng) for a in args}
    expect = reference_copy(values)
    op.run_reference(cfg, expect)
    on_device = {k: tvm.runtime.tensor(v, device) if isinstance(v, np.ndarray) else v for k, v in values.items()}
    kernel(**on_device)
    for a in args:
        if a.role in ("out", "state"):
            got = on_device[a.name].numpy()
            assert_close(got, expect[a.name], 0 if op.exact else TOL_OP, f"{op.name}.{a.name}")


def reference_copy(values: dict) -> dict:
    """float64 copies of float arrays, copies of int arrays, scalars as they are."""
    return {
        k: v.astype(np.float64)
        if isinstance(v, np.ndarray) and v.dtype.kind == "f"
        else np.copy(v)
        if isinstance(v, np.ndarray)
        else v
        for k, v in values.items()
    }
