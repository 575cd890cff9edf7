"""Every registry op against its float64 reference on llvm, for every test case."""

from __future__ import annotations

import pytest
from conftest import CASES, TOL_OP, assert_close, reference_copy

from gdn_tvm.build.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", OPS)
def test_op_matches_reference(name, case, rng):
    op, cfg = OPS[name], CASES[case]
    kernel = compile_op(op, cfg, llvm())
    args = visible(op.signature(cfg))
    values = {a.name: sample(a, rng) for a in args}
    expect = reference_copy(values)
    op.reference(**expect)
    kernel(**values)
    for a in args:
        if a.role in ("out", "state"):
            assert_close(values[a.name], expect[a.name], 0 if op.exact else TOL_OP, f"{name}[{case}].{a.name}")
