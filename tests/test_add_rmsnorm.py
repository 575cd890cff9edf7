"""The residual add + RMSNorm and the plain RMSNorm at a hidden size no thread layout divides (the presets' all do):
every knob design on the emulated CUDA kernel, and llvm, against the reference; the residual updated in place."""

from __future__ import annotations

import pytest
from conftest import CASES, check_kernel_against_reference, check_op_against_reference
from cuda_emu import emulated, lower

from gdn_tvm.registry import OPS
from gdn_tvm.target import llvm
from gdn_tvm.tuning.space import knob_grid

CFG = CASES["4b-B3"].replace(hidden=1000)


@pytest.mark.parametrize("name", ["add_rmsnorm", "rmsnorm"])
def test_a_hidden_size_of_partial_thread_rows_matches_reference(name, rng):
    op = OPS[name]
    check_op_against_reference(op, CFG, llvm(), rng)
    for knobs in knob_grid(op, "cuda"):
        kernel = emulated(op, CFG, *lower(op.schedule(CFG, "cuda", **knobs).mod))
        check_kernel_against_reference(op, CFG, kernel, rng)
