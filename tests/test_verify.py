"""The numerics contract's comparison and the kernel check the tests and the tuner share."""

from __future__ import annotations

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


def test_check_kernel_reports_outputs_a_kernel_leaves_unwritten(rng):
    """Outputs start NaN-poisoned: a kernel that writes nothing fails on every output."""
    op, cfg = OPS["sigmoid_gate"], CASES["0.8b-B1"]
    idle = Kernel(op.name, lambda *args: None, op.signature(cfg), (1, 0))
    failed = check_kernel(op, cfg, idle, rng)
    assert failed and all("unwritten" in f for f in failed)
