"""The numerics contract's comparison and the kernel check the tests and the tuner share."""

from __future__ import annotations

import ml_dtypes
import numpy as np
from conftest import CASES

from gdn_tvm.registry import OPS
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.verify import check_kernel, mismatch


def test_mismatch_names_each_way_to_fail():
    ref = np.array([1.0, -2.0, np.nan])
    assert mismatch(ref + [1e-5, 0, 0], ref, 1e-4) is None
    assert "relative L-inf error 1.000e-03" in mismatch(ref + [2e-3, 0, 0], ref, 1e-4)
    assert "1 unwritten/NaN" in mismatch(np.array([np.nan, -2.0, np.nan]), ref, 1e-4)
    assert "1 elements differ" in mismatch(np.array([1.0, -2.0 + 1e-12, np.nan]), ref, 0)
    assert "written where they must stay untouched" in mismatch(np.array([1.0, -2.0, 0.0]), ref, 0)
    assert "shape" in mismatch(ref[:2], ref, 1e-4)
    assert "all zeros" in mismatch(np.zeros(2), np.zeros(2), 1e-4)


def test_a_computed_bf16_output_may_round_to_the_reference_elements_neighbour():
    """One bf16 ulp (2^-8 relative, where float32 and float64 values straddle a rounding midpoint) is allowed beyond
    the tolerance; two ulps, or an error in a float32 output of that size, are not."""
    ref = np.array([1.0, 0.75, -3.0]).astype(ml_dtypes.bfloat16)  # the reference rounds as the kernel stores
    up = np.array([1.0 + 2**-7, 0.75, -3.0]).astype(ml_dtypes.bfloat16)  # 1.0's neighbour above: one ulp (2^-7)
    assert mismatch(up, ref.astype(np.float64), 1e-3) is None
    two = np.array([1.0 + 2**-6, 0.75, -3.0]).astype(ml_dtypes.bfloat16)
    assert "beyond one bf16 ulp" in mismatch(two, ref.astype(np.float64), 1e-3)
    assert "relative L-inf error" in mismatch(up.astype(np.float32), ref.astype(np.float64), 1e-3)
    assert "elements differ" in mismatch(up, ref.astype(np.float64), 0)  # data movement stays bit for bit
    # a zero reference element has no neighbour allowance (frexp(0) would otherwise grant 2^-8)
    nonzero = np.array([1.0, 2**-9, -0.5]).astype(ml_dtypes.bfloat16)
    assert "beyond one bf16 ulp" in mismatch(nonzero, np.array([1.0, 0.0, -0.5]), 1e-3)


def test_check_kernel_reports_outputs_a_kernel_leaves_unwritten(rng):
    """Outputs start NaN-poisoned: a kernel that writes nothing fails on every output."""
    op, cfg = OPS["sigmoid_gate"], CASES["0.8b-B1"]
    idle = Kernel(op.name, lambda *args: None, op.signature(cfg), (1, 0))
    failed = check_kernel(op, cfg, idle, rng)
    assert failed and all("unwritten" in f for f in failed)
