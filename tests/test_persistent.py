"""Persistent fusion (`codegen.persistent.fuse`): a decoder layer's MLP at B = 1, gate|up (RMSNorm prologue, SwiGLU
epilogue) then down (residual epilogue), as one emulated CUDA kernel on a few CTAs that each run several of each
kernel's CTAs, with a grid barrier between: the same stream and activations as the two ops' references, and the
barrier counters back at zero after each launch."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import CASES
from cuda_emu import launcher, lower

from gdn_tvm.codegen.persistent import fuse
from gdn_tvm.registry import OPS
from gdn_tvm.signature import bind, sample, visible
from gdn_tvm.verify import mismatch, reference_copy, tolerance

CFG = CASES["0.8b-B1"]
GATE_UP, DOWN = OPS["gemv_gate_up_proj_rmsnorm_swiglu"], OPS["gemv_down_proj_residual"]
# down's CTAs shaped as gate|up's (32 x 8 threads): a fused kernel has one CTA shape
DOWN_KNOBS = {"rows": 8, "threads_per_row": 32}


def _fused(ctas: int):
    funcs = [GATE_UP.schedule(CFG, "cuda").mod["main"], DOWN.schedule(CFG, "cuda", **DOWN_KNOBS).mod["main"]]
    return launcher(*lower(tvm.IRModule({"main": fuse(funcs, ctas)})))


@pytest.mark.parametrize("ctas", [5, 16])
def test_the_mlp_as_one_persistent_kernel(ctas, rng):
    """5 CTAs run 90 and 103 of the kernels' 448 and 512 CTAs (the last ones fewer); 16 run 28 and 32 each."""
    up_args, down_args = visible(GATE_UP.signature(CFG)), visible(DOWN.signature(CFG))
    up = {a.name: sample(a, rng) for a in up_args}
    down = {a.name: sample(a, rng) for a in down_args} | {"x": up["y"]}
    expect_up = reference_copy(up)
    GATE_UP.run_reference(CFG, expect_up)
    expect_down = reference_copy(down) | {"x": expect_up["y"].astype(np.float32)}
    DOWN.run_reference(CFG, expect_down)
    sync = np.zeros(2, np.int32)
    kernel = _fused(ctas)
    # the activation is gate|up's output and down's input: one array bound to both parameters
    kernel(*bind(GATE_UP.signature(CFG), up), *bind(DOWN.signature(CFG), down | {"x": up["y"]}), sync)
    tol = tolerance(a.dtype for a in up_args + down_args)
    for name, got, want in (("y", up["y"], expect_up["y"]), ("residual", down["residual"], expect_down["residual"])):
        why = mismatch(got, want, tol)
        assert why is None, f"{name}: {why}"
    assert not sync.any()


def test_kernels_of_different_cta_shapes_are_refused():
    funcs = [
        GATE_UP.schedule(CFG, "cuda").mod["main"],
        DOWN.schedule(CFG, "cuda", rows=4, threads_per_row=64).mod["main"],
    ]
    with pytest.raises(ValueError, match="kernel 1: CTAs of"):
        fuse(funcs, 4)
