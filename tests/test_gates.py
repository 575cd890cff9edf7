"""gates: both softplus branches, element by element, around the threshold 20 and where exp overflows."""

from __future__ import annotations

import numpy as np
from conftest import CASES

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.verify import reference_copy


def test_softplus_branches(rng):
    op, cfg = OPS["gates"], CASES["4b-B3"]
    kernel = compile_op(op, cfg, llvm())
    values = {a.name: sample(a, rng) for a in visible(op.signature(cfg))}
    x = np.resize(np.float32([-30, -5, 0, 3, 19.5, 19.99, 20.01, 20.5, 35, 100, 200]), values["a"].shape)
    values["dt_bias"] = rng.uniform(-1, 1, values["dt_bias"].shape).astype(np.float32)
    values["a"] = x - values["dt_bias"]
    expect = reference_copy(values)
    op.reference(**expect)
    kernel(**values)
    np.testing.assert_allclose(values["g"], expect["g"], rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(values["beta"], expect["beta"], rtol=1e-5)
