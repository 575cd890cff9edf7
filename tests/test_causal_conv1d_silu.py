"""causal_conv1d_silu: the state shift is bit-exact, and several steps carried through the state agree."""

from __future__ import annotations

import numpy as np
from conftest import CASES, assert_close

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.verify import TOL_OP, reference_copy


def test_state_shift_exact_over_steps(rng):
    op, cfg = OPS["causal_conv1d_silu"], CASES["4b-B3"]
    kernel = compile_op(op, cfg, llvm())
    args = visible(op.signature(cfg))
    values = {a.name: sample(a, rng) for a in args}
    state = values["state"]
    expect_state = state.astype(np.float64)
    for step in range(5):
        values |= {a.name: sample(a, rng) for a in args if a.name in ("x", "y")}
        before = state.copy()
        expect = reference_copy(values) | {"state": expect_state}
        op.reference(**expect)
        kernel(**values)
        assert_close(values["y"], expect["y"], TOL_OP, f"step {step}: y")
        slots = values["slots"]
        active = slots[slots >= 0]
        shifted = np.concatenate([before[active, :, 1:], values["x"][slots >= 0, :, None]], axis=-1)
        assert np.array_equal(state[active], shifted), f"step {step}: shifted state not bit-exact"
        untouched = np.setdiff1d(np.arange(cfg.slots), active)
        assert np.array_equal(state[untouched], before[untouched]), f"step {step}: an inactive slot changed"
        assert_close(state, expect_state, TOL_OP, f"step {step}: state")
