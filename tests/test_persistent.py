"""Persistent fusion (`codegen.persistent.fuse`), emulated: a decoder layer's MLP at B = 1, gate|up (RMSNorm prologue,
SwiGLU epilogue) then down (residual epilogue), as one CUDA kernel on a few CTAs that each run several of each
kernel's CTAs, with a grid barrier between (and down's weight asked of L2 before it), against the two ops'
references; a whole GDN decoder layer (five kernels, states updated in place) fused against its launches run one after
another; the barrier counters back at zero."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import CASES
from cuda_emu import emulated, launcher, lower

from gdn_tvm import plan
from gdn_tvm.codegen.persistent import fuse
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.layers import Layer
from gdn_tvm.runtime.weights import random_weights
from gdn_tvm.signature import bind, sample, visible
from gdn_tvm.verify import mismatch, reference_copy, tolerance

CFG = CASES["0.8b-B1"]
GATE_UP, DOWN = OPS["gemv_gate_up_proj_rmsnorm_swiglu"], OPS["gemv_down_proj_residual"]
# down's CTAs shaped as gate|up's (32 x 8 threads): a fused kernel has one CTA shape
DOWN_KNOBS = {"rows": 8, "threads_per_row": 32}


def _fused(ctas: int, prefetch: bool):
    funcs = [GATE_UP.schedule(CFG, "cuda").mod["main"], DOWN.schedule(CFG, "cuda", **DOWN_KNOBS).mod["main"]]
    source, launches = lower(tvm.IRModule({"main": fuse(funcs, ctas, prefetch=[[], ["w"] if prefetch else []])}))
    # a helper defined once and called once (in the emulator each thread's prefetches are hints, with no effect)
    assert source.count("gdn_tvm_prefetch_l2(") == (2 if prefetch else 0)
    return launcher(source, launches)


@pytest.mark.parametrize(("ctas", "prefetch"), [(5, True), (16, False)])
def test_the_mlp_as_one_persistent_kernel(ctas, prefetch, rng):
    """5 CTAs run up to 90 of gate|up's 448 CTAs and 26 of down's 128 (the last ones fewer), asking L2 for down's
    weight before the barrier, a share each (7,340,032 bytes: shares of 1,468,032, the last one shorter): every
    128-byte line of it once, nothing else; 16 CTAs run 28 and 8 each."""
    up_args, down_args = visible(GATE_UP.signature(CFG)), visible(DOWN.signature(CFG))
    up = {a.name: sample(a, rng) for a in up_args}
    down = {a.name: sample(a, rng) for a in down_args} | {"x": up["y"]}
    expect_up = reference_copy(up)
    GATE_UP.run_reference(CFG, expect_up)
    expect_down = reference_copy(down) | {"x": expect_up["y"].astype(np.float32)}
    DOWN.run_reference(CFG, expect_down)
    sync = np.zeros(2, np.int32)
    kernel = _fused(ctas, prefetch)
    # the activation is gate|up's output and down's input: one array bound to both parameters
    kernel(*bind(GATE_UP.signature(CFG), up), *bind(DOWN.signature(CFG), down | {"x": up["y"]}), sync)
    tol = tolerance(a.dtype for a in up_args + down_args)
    for name, got, want in (("y", up["y"], expect_up["y"]), ("residual", down["residual"], expect_down["residual"])):
        why = mismatch(got, want, tol)
        assert why is None, f"{name}: {why}"
    assert not sync.any()
    w = len(GATE_UP.signature(CFG))  # down's weight, the first of down's parameters
    lines = range(0, down["w"].nbytes, 128) if prefetch else range(0)
    assert sorted(kernel.prefetches) == [(w, at) for at in lines]


def test_what_one_kernel_cannot_hold_is_refused():
    """Kernels of different CTA shapes, one PrimFunc twice (its parameters would be bound twice), and prefetches
    for the first kernel (no barrier ahead of it) or of a parameter the kernel lacks."""
    up = GATE_UP.schedule(CFG, "cuda").mod["main"]
    with pytest.raises(ValueError, match="kernel 1: CTAs of"):
        fuse([up, DOWN.schedule(CFG, "cuda", rows=4, threads_per_row=64).mod["main"]], 4)
    with pytest.raises(ValueError, match="kernel 1: the PrimFunc of an earlier kernel"):
        fuse([up, up], 4)
    down = DOWN.schedule(CFG, "cuda", **DOWN_KNOBS).mod["main"]
    with pytest.raises(ValueError, match="none for the first"):
        fuse([up, down], 4, prefetch=[["w"], []])
    with pytest.raises(ValueError, match="kernel 1 has no parameter weight"):
        fuse([up, down], 4, prefetch=[[], ["weight"]])


def test_a_gdn_decoder_layer_as_one_persistent_kernel(rng):
    """The five kernels of a GDN decoder layer at B = 1 (in_proj with its RMSNorm and conv epilogue, the fused delta
    rule, out_proj with its gated norm and residual add, gate|up, down) bound as a step binds them, after a first step
    has filled the conv and recurrent states: a second step as five launches and as one kernel on 7 CTAs (4
    barriers) leaves the same stream and states, bit for bit (the same kernels, the emulator's one rounding)."""
    cpu, m = tvm.cpu(), CFG.model
    gdn = plan.gdn(CFG, block=True)
    names = [*gdn.ops, GATE_UP.name, DOWN.name]
    funcs = {n: OPS[n].schedule(CFG, "cuda", **(DOWN_KNOBS if n == DOWN.name else {})).mod["main"] for n in names}
    kernels = {n: emulated(OPS[n], CFG, *lower(tvm.IRModule({"main": f}))) for n, f in funcs.items()}

    def tensor(shape, scale=1.0):
        return tvm.runtime.tensor((scale * rng.standard_normal(shape)).astype(np.float32), cpu)

    x = tensor((1, m.hidden))
    inputs = {"x": x, "input_norm": tensor((m.hidden,), 0.1), "slots": tvm.runtime.tensor(np.int32([0]), cpu)}
    inputs["positions"] = tvm.runtime.tensor(np.int32([5]), cpu)
    layer = Layer(gdn, CFG, kernels, random_weights(m, "gdn", rng), inputs)
    act = tvm.runtime.empty((1, m.intermediate_size), "float32", cpu)
    gate_up, down = (tensor(m.projections[p], 1 / np.sqrt(m.projections[p][1])) for p in ("gate_up_proj", "down_proj"))
    mlp = [
        (
            kernels[GATE_UP.name].func,
            bind(GATE_UP.signature(CFG), {"w": gate_up, "x": x, "norm_weight": tensor((m.hidden,), 0.1), "y": act}),
        ),
        (kernels[DOWN.name].func, bind(DOWN.signature(CFG), {"w": down, "x": act, "residual": x})),
    ]
    launches = [*layer.launches, *mlp]
    watched = [x, *layer.states]

    def step() -> list[np.ndarray]:
        for func, args in launches:
            func(*args)
        return [t.numpy() for t in watched]

    before = step()  # states no longer zero
    expect = step()
    for t, value in zip(watched, before, strict=True):
        t.copyfrom(value)
    sync = np.zeros(2, np.int32)
    launcher(*lower(tvm.IRModule({"main": fuse([funcs[n] for n in names], 7)})))(
        *(a for _, args in launches for a in args), sync
    )
    for name, got, want in zip(("x", "conv_state", "rec_state"), (t.numpy() for t in watched), expect, strict=True):
        assert np.array_equal(got, want), f"{name}: {mismatch(got, want, 0)}"
    assert not sync.any()
