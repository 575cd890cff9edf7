"""The embedding lookup: a token id outside the vocabulary reads nothing and yields a zero row (the checked entry
point refuses it by name; the kernel itself, run unchecked as a replayed graph runs it, stays in bounds)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CASES
from cuda_emu import emulated, lower

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.signature import ArgumentError, sample, visible
from gdn_tvm.target import llvm

OP, CFG = OPS["embedding"], CASES["4b-B3"]


def _kernel(target: str):
    if target == "llvm":
        return compile_op(OP, CFG, llvm())
    return emulated(OP, CFG, *lower(OP.schedule(CFG, "cuda").mod))


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_an_id_outside_the_vocabulary_yields_a_zero_row_unchecked(target, rng):
    V = CFG.model.vocab_size
    values = {a.name: sample(a, rng) for a in visible(OP.signature(CFG))}
    kernel = _kernel(target)
    for bad in (-1, V, 2**31 - 1, -(2**31)):
        ids = rng.integers(0, V, CFG.batch, dtype=np.int32)
        lane = int(rng.integers(CFG.batch))
        ids[lane] = bad
        rows = np.full_like(values["rows"], np.nan)
        kernel.launch(values | {"ids": ids, "rows": rows})
        expect = values["table"][np.clip(ids, 0, V - 1)]
        expect[lane] = 0
        assert np.array_equal(rows, expect), f"id {bad} in lane {lane}"
    with pytest.raises(ArgumentError, match=rf"ids\[0\]={V} is outside \[0, {V}\)"):
        kernel(**(values | {"ids": np.full(CFG.batch, V, np.int32)}))
