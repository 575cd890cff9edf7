"""64 decode steps of each layer mixer and of a small hybrid stack, composed from the kernels (llvm), in float32 and
with bf16 weights and KV caches, against the float64 whole-step reference with states carried; rejected steps change
no state."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tvm
from conftest import BF16_CASES, CASES, F32, OnCuda, assert_close

from gdn_tvm.codegen.compile import build_kernels
from gdn_tvm.config import PRESETS, DecodeConfig
from gdn_tvm.plan import step_ops, stored_dtype
from gdn_tvm.reference.decode_step import attention_mixer_step, gdn_mixer_step
from gdn_tvm.runtime import layers
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.runtime.weights import BF16_OVERFLOW, random_weights, unstack
from gdn_tvm.signature import ArgumentError
from gdn_tvm.target import llvm
from gdn_tvm.verify import tolerance

STEPS = 64
LAYER_CASES = {
    "0.8b-B1": CASES["0.8b-B1"],
    "4b-B3": CASES["4b-B3"],
    **BF16_CASES,
    "4b-B3-bf16-f32-state": BF16_CASES["4b-B3-bf16"].replace(state_dtype="float32"),
}
STACKS = [("gdn",), ("attention",), ("gdn", "gdn", "gdn", "attention")]
# Each layer alone at every case; a stack only where its recurrent states are float32. With bf16 states a stack of
# three GDN layers and an attention one drifts from its reference past one layer's tolerance (5.2e-3 at 64 steps):
# where float32 and float64 updates straddle a bf16 rounding midpoint the two states round to neighbours, and the
# two trajectories go on from there.
LAYER_RUNS = [(c, t) for c in LAYER_CASES for t in STACKS if len(t) == 1 or LAYER_CASES[c].state_dtype == "float32"]
_KERNELS: dict[str, dict] = {}


def _kernels(case: str) -> dict:
    """The llvm kernels of a step at `LAYER_CASES[case]`, built once."""
    if case not in _KERNELS:
        cfg = LAYER_CASES[case]
        _KERNELS[case] = build_kernels(cfg, llvm(), step_ops(cfg))
    return _KERNELS[case]


def make_stack(case: str, layer_types: tuple[str, ...], seed: int) -> HybridStack:
    return HybridStack(LAYER_CASES[case], _kernels(case), tvm.cpu(), layer_types=layer_types, seed=seed)


class ReferenceStack:
    """The same layers stepped by reference/decode_step.py, states as float64 numpy pools."""

    def __init__(self, stack: HybridStack):
        self.m, self.types, self.cfg = stack.cfg.model, stack.layer_types, stack.cfg
        host = [{k: v.numpy().astype(np.float64) for k, v in layer.weights.items()} for layer in stack.layers]
        self.weights = [unstack(self.m, w) for w in host]  # by checkpoint names, stacked projections split
        self.states = [[t.numpy().astype(np.float64) for t in layer.states] for layer in stack.layers]

    def step(self, x: np.ndarray, positions: np.ndarray, slots: np.ndarray) -> np.ndarray:
        for kind, w, st in zip(self.types, self.weights, self.states, strict=True):
            if kind == "gdn":
                x = gdn_mixer_step(self.m, w, x, st[0], st[1], slots, self.cfg.state_dtype)
            else:
                x = attention_mixer_step(self.m, w, x, st[0], st[1], slots, positions, self.cfg.kv_dtype)
            x = np.nan_to_num(x)  # skipped lanes feed zeros on; their outputs are not compared
        return x


def assert_decodes_like_reference(stack: HybridStack, rng: np.random.Generator, steps: int) -> None:
    """One acquired slot decoded for `steps` positions from 0, each output within the layer tolerance of the stack's
    dtypes (1e-3 in float32) of the reference stack."""
    cfg = stack.cfg
    tol = tolerance((cfg.weight_dtype, cfg.kv_dtype, cfg.state_dtype), layer=True)
    ref = ReferenceStack(stack)
    slots = np.array([stack.acquire()], np.int32)
    for t in range(steps):
        x = rng.standard_normal((1, stack.cfg.model.hidden)).astype(np.float32)
        out = stack.step(x, [t], slots).numpy()
        assert_close(out, ref.step(x.astype(np.float64), np.array([t]), slots), tol, f"step {t}")


def assert_preset_stack_decodes(cfg, kernels, device, rng: np.random.Generator, graph: bool) -> None:
    """The whole mixer stack of `cfg`'s preset (every layer of its pattern) steps twice, each step run a second time
    from the same states (by graph replay when `graph`, else eagerly again): bit-identical outputs and states.

    Its deep outputs are not compared with the reference: mixers with random weights and without the model's
    residual path shrink the signal quadratically from layer to layer (below float32's range within ten layers).
    One period of the pattern on the same kernels is: four steps within the layer tolerance of the float64 reference."""
    name = cfg.model.name
    slots, start = lanes(cfg, rng)
    # one draw a kind, shared by its layers: drawing a 27b stack's 25 GB of weights took minutes of the GPU run
    drawn = {kind: random_weights(cfg.model, kind, rng) for kind in sorted(set(cfg.model.layer_types))}
    full = HybridStack(cfg, kernels, device, weights=[drawn[kind] for kind in cfg.model.layer_types])
    assert len(full.layers) == len(cfg.model.layer_types)
    again = full.step
    if graph:
        full.capture()
        again = full.step_graph
    for t in range(2):
        x = rng.standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
        before = [[state.numpy() for state in layer.states] for layer in full.layers]
        first = full.step(x, start + t, slots).numpy()
        first_states = [[state.numpy() for state in layer.states] for layer in full.layers]
        for layer, saved in zip(full.layers, before, strict=True):
            for state, value in zip(layer.states, saved, strict=True):
                state.copyfrom(value)
        assert np.array_equal(again(x, start + t, slots).numpy(), first), f"{name} step {t}: second run differs"
        for layer, expect in zip(full.layers, first_states, strict=True):
            for state, value in zip(layer.states, expect, strict=True):
                assert np.array_equal(state.numpy(), value), f"{name} step {t}: {layer.kind} state differs"

    period = cfg.model.layer_types[: cfg.model.full_attention_interval]
    tol = tolerance((cfg.weight_dtype, cfg.kv_dtype, cfg.state_dtype), layer=True)
    stack = HybridStack(cfg, kernels, device, layer_types=period, seed=int(rng.integers(2**31)))
    ref = ReferenceStack(stack)
    for t in range(4):
        x = rng.standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
        out = stack.step(x, start + t, slots).numpy()
        assert_close(out, ref.step(x.astype(np.float64), start + t, slots), tol, f"{name} step {t}")


def lanes(cfg, rng) -> tuple[np.ndarray, np.ndarray]:
    """Per-lane slots (one lane skipped when B >= 3) and distinct start positions."""
    slots = rng.permutation(cfg.slots)[: cfg.batch].astype(np.int32)
    if cfg.batch >= 3:
        slots[1] = -1
    start = rng.integers(0, cfg.max_len - STEPS, cfg.batch).astype(np.int32)
    return slots, start


@pytest.mark.parametrize(("case", "types"), LAYER_RUNS, ids=[f"{'-'.join(t)}-{c}" for c, t in LAYER_RUNS])
def test_decode_steps_match_reference(case, types, rng):
    stack = make_stack(case, types, seed=int(rng.integers(2**31)))
    cfg = stack.cfg
    tol = tolerance((cfg.weight_dtype, cfg.kv_dtype, cfg.state_dtype), layer=True)
    ref = ReferenceStack(stack)
    slots, start = lanes(cfg, rng)
    active = slots >= 0
    for t in range(STEPS):
        x = rng.standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
        x[~active] = 0.0
        positions = start + t
        out = stack.step(x, positions, slots).numpy()
        expect = ref.step(x.astype(np.float64), positions, slots)
        assert_close(out[active], expect[active], tol, f"{'-'.join(types)} step {t} out")
    for layer, ref_states in zip(stack.layers, ref.states, strict=True):
        for state, expect in zip(layer.states, ref_states, strict=True):
            assert_close(state.numpy(), expect, tol, f"{layer.kind} state after {STEPS} steps")


BAD_STEPS = {
    "position past the cache": dict(positions=lambda c: np.full(c.batch, c.max_len, np.int32)),
    "positions dtype": dict(positions=lambda c: np.zeros(c.batch, np.int64)),
    "fractional positions": dict(positions=lambda c: [1.9] * c.batch),
    "slots past int32": dict(slots=lambda c: [2**32] * c.batch),
    "x device": dict(x=lambda c: np.zeros((c.batch, c.model.hidden), np.float32).view(OnCuda)),
    "slots device": dict(slots=lambda c: np.arange(c.batch, dtype=np.int32).view(OnCuda)),
    "negative position": dict(positions=lambda c: np.full(c.batch, -1, np.int32)),
    "unknown slot": dict(slots=lambda c: np.full(c.batch, c.slots, np.int32)),
    "slot below -1": dict(slots=lambda c: np.full(c.batch, -2, np.int32)),
    "x dtype": dict(x=lambda c: np.zeros((c.batch, c.model.hidden), np.float64)),
    "x shape": dict(x=lambda c: np.zeros((c.batch, c.model.hidden + 1), np.float32)),
    "positions shape": dict(positions=lambda c: np.zeros(c.batch + 1, np.int32)),
    "duplicate slots": dict(slots=lambda c: np.zeros(c.batch, np.int32)),
}


@pytest.mark.parametrize("bad", BAD_STEPS)
def test_rejected_step_leaves_states_untouched(bad, rng):
    stack = make_stack("4b-B3", ("gdn", "attention"), seed=1)
    cfg = stack.cfg
    slots = np.arange(cfg.batch, dtype=np.int32)
    good = dict(
        x=rng.standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32),
        positions=np.zeros(cfg.batch, np.int32),
        slots=slots,
    )
    stack.step(**good)  # states now hold data
    before = states(stack)
    ((name, make_bad),) = BAD_STEPS[bad].items()
    with pytest.raises(ArgumentError, match=name if bad != "duplicate slots" else "distinct"):
        stack.step(**(good | {name: make_bad(cfg)}))
    assert_states_equal(stack, before)


def states(stack: HybridStack) -> list[np.ndarray]:
    """Host copies of every layer's states, in order."""
    return [s.numpy() for layer in stack.layers for s in layer.states]


def assert_states_equal(stack: HybridStack, expected: list[np.ndarray]) -> None:
    for b, a in zip(expected, states(stack), strict=True):
        assert np.array_equal(a, b)


def test_step_takes_python_int_sequences(rng):
    """Lists of ints are converted to int32; the step matches the same step given int32 arrays."""
    stacks = [make_stack("4b-B3", ("attention",), seed=2) for _ in range(2)]
    x = rng.standard_normal((3, stacks[0].cfg.model.hidden)).astype(np.float32)
    out_lists = stacks[0].step(x, [4, 0, 7], [2, -1, 0]).numpy()
    out_arrays = stacks[1].step(x, np.array([4, 0, 7], np.int32), np.array([2, -1, 0], np.int32)).numpy()
    assert np.array_equal(out_lists[[0, 2]], out_arrays[[0, 2]])


@pytest.mark.parametrize("slot", [-1, 4, 1.0, True])
def test_reset_and_release_reject_a_bad_slot_by_name(slot, rng):
    stack = make_stack("4b-B3", ("gdn", "attention"), seed=3)
    x = rng.standard_normal((3, stack.cfg.model.hidden)).astype(np.float32)
    stack.step(x, np.arange(3, dtype=np.int32), np.arange(3, dtype=np.int32))
    before = states(stack)
    for call in (stack.reset, stack.release):
        with pytest.raises(ArgumentError, match="slot"):
            call(slot)
    assert_states_equal(stack, before)


def test_slots_in_use_are_not_handed_out_and_release_zeroes_only_its_slot(rng):
    """A slot named by a step is in use: `acquire` skips it, releasing a free slot is an error, and `release`
    zeroes that slot's rows of every state and leaves the other slots' rows bit-identical."""
    stack = make_stack("4b-B3", ("gdn", "attention"), seed=4)
    cfg = stack.cfg
    x = rng.standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
    for t in range(3):
        stack.step(x, np.full(cfg.batch, t, np.int32), np.array([1, 3, -1], np.int32))
    assert stack.acquire() == 0 and stack.acquire() == 2
    with pytest.raises(RuntimeError, match="in use"):
        stack.acquire()
    stack.release(2)  # acquired, never stepped: still all zeros
    with pytest.raises(ArgumentError, match="slot=2 is not in use"):
        stack.release(2)
    before = states(stack)
    assert all(np.abs(b[[1, 3]]).max() > 0 for b in before), "the stepped slots hold state"
    stack.release(3)
    for b, a in zip(before, states(stack), strict=True):
        assert not a[3].any()
        assert np.array_equal(np.delete(a, 3, axis=0), np.delete(b, 3, axis=0))
    assert stack.acquire() == 2 and stack.acquire() == 3


def test_steps_from_two_threads_match_the_same_steps_in_turn(rng):
    """Two threads step their own slots of one stack at once; every slot's states end bit-identical to the same
    steps taken one after the other (the stack's lock keeps input writes and launches together)."""
    steps, cfg = 12, LAYER_CASES["4b-B3"]
    xs = rng.standard_normal((2, steps, cfg.batch, cfg.model.hidden)).astype(np.float32)

    def lane(stack, slot: int):
        for t in range(steps):
            stack.step(xs[slot, t], [t, 0, 0], [slot, -1, -1])

    together = make_stack("4b-B3", ("gdn", "attention"), seed=6)
    threads = [threading.Thread(target=lane, args=(together, slot)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    in_turn = make_stack("4b-B3", ("gdn", "attention"), seed=6)
    for slot in (0, 1):
        lane(in_turn, slot)
    assert_states_equal(together, states(in_turn))


def test_float32_weights_of_a_bf16_stack_are_rounded_once_to_nearest_even(rng):
    """Float32 weights given to a bf16 stack become its bf16 weights as numpy rounds them (the stacked projection's
    parts too); the gates' A and dt_bias stay float32."""
    cfg = BF16_CASES["0.8b-B1-bf16"]
    w = random_weights(cfg.model, "gdn", rng)
    (layer,) = HybridStack(cfg, _kernels("0.8b-B1-bf16"), tvm.cpu(), layer_types=("gdn",), weights=[w]).layers
    got = unstack(cfg.model, {k: v.numpy() for k, v in layer.weights.items()})
    for name, value in w.items():
        dtype = stored_dtype(name, "bfloat16")
        assert got[name].dtype == dtype and np.array_equal(got[name], value.astype(dtype)), name
    assert {str(layer.weights[n].dtype) for n in ("in_proj", "conv1d", "norm", "A")} == {"bfloat16", "float32"}


@pytest.mark.parametrize(("name", "dtype"), [("out_proj", np.float64), ("norm", np.float16), ("A", "bfloat16")])
def test_weight_of_another_dtype_is_rejected_by_name(name, dtype):
    """A weight in neither its stored dtype nor float32 (A stays float32 in a bf16 stack) is refused, naming it."""
    cfg = BF16_CASES["0.8b-B1-bf16"]
    w = random_weights(cfg.model, "gdn", np.random.default_rng(0))
    w[name] = w[name].astype(dtype)
    with pytest.raises(ArgumentError, match=f"weight {name}: expected"):
        HybridStack(cfg, {}, tvm.cpu(), layer_types=("gdn",), weights=[w])


def test_nan_weight_is_rejected_by_name():
    cfg = LAYER_CASES["0.8b-B1"]
    from gdn_tvm.runtime.weights import random_weights

    w = random_weights(cfg.model, "gdn", np.random.default_rng(0))
    w["out_proj"][3, 5] = np.nan
    with pytest.raises(ArgumentError, match="out_proj"):
        HybridStack(cfg, {}, tvm.cpu(), layer_types=("gdn",), weights=[w])


@pytest.mark.parametrize("layer_types", ["gdn", (), ("gdn", "mamba"), (1,)])
def test_layer_types_that_are_not_layer_kinds_are_refused_by_name(layer_types):
    cfg = CASES["0.8b-B1"]
    with pytest.raises(ArgumentError, match="layer_types: expected a non-empty sequence of"):
        HybridStack(cfg, {}, tvm.cpu(), layer_types=layer_types)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", None])
def test_a_seed_that_numpy_cannot_take_is_refused_by_name(seed):
    with pytest.raises(ArgumentError, match=r"seed: expected an int >= 0, got"):
        HybridStack(CASES["0.8b-B1"], {}, tvm.cpu(), layer_types=("gdn",), seed=seed)


def test_a_cpu_stack_refuses_to_capture_a_cuda_graph_and_writes_nothing():
    stack = make_stack("0.8b-B1", ("gdn",), seed=0)
    before = [t.numpy().copy() for layer in stack.layers for t in layer.states]
    with pytest.raises(RuntimeError, match=r"capture\(\) makes CUDA graphs: this stack runs on cpu"):
        stack.capture()
    after = [t.numpy() for layer in stack.layers for t in layer.states]
    assert all(np.array_equal(a, b) for a, b in zip(after, before, strict=True))


def test_float32_weight_past_bf16_range_is_rejected_by_name():
    """A float32 weight finite in float32 but rounding to inf in a bf16 stack's storage (from 0x7F7F8000 up) is
    refused, naming it; the largest one that rounds to a finite bf16 is taken."""
    cfg = BF16_CASES["0.8b-B1-bf16"]
    w = random_weights(cfg.model, "gdn", np.random.default_rng(0))
    w["norm"][1] = -np.nextafter(BF16_OVERFLOW, np.float32(0))
    with pytest.raises(ArgumentError, match="kernels: no kernel"):  # the weights passed: binding the launches next
        HybridStack(cfg, {}, tvm.cpu(), layer_types=("gdn",), weights=[w])
    w["norm"][2] = -BF16_OVERFLOW
    with pytest.raises(ArgumentError, match=r"weight norm: holds NaN or inf \(as bfloat16\)"):
        HybridStack(cfg, {}, tvm.cpu(), layer_types=("gdn",), weights=[w])
    w["norm"] = w["norm"].tolist()
    with pytest.raises(ArgumentError, match="weight norm: expected an array, got list"):
        HybridStack(cfg, {}, tvm.cpu(), layer_types=("gdn",), weights=[w])


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in ("qwen3.5-0.8b", "qwen3.5-4b")])
def test_every_preset_pattern_period_decodes(name, rng):
    """One period of each remaining preset's layer pattern (3 GDN + 1 attention layers, its real head counts and
    hidden size), 4 steps on llvm against the reference; the full stacks of the large presets do not fit a CPU."""
    cfg = DecodeConfig(PRESETS[name], batch=1, max_len=16, split_len=8, **F32)
    period = cfg.model.layer_types[: cfg.model.full_attention_interval]
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=period, seed=5)
    assert_decodes_like_reference(stack, rng, steps=4)


def test_weights_on_the_device_are_shared_not_copied():
    """Contiguous, 64-byte aligned arrays already on the device are used through DLPack; others are copied."""
    from gdn_tvm.plan import Buffer
    from gdn_tvm.runtime.weights import upload

    buf = np.zeros(64 * 64 + 16, np.float32)
    start = (-buf.ctypes.data % 64) // 4
    aligned, misaligned = buf[start : start + 4096].reshape(64, 64), buf[start + 1 : start + 4097].reshape(64, 64)
    given = {"aligned": aligned, "misaligned": misaligned, "strided": aligned[:, ::2]}
    uploaded = upload(given, {name: Buffer(w.shape, "weight") for name, w in given.items()}, tvm.cpu())
    buf[:] = 1.0
    assert uploaded["aligned"].numpy().min() == 1.0
    assert uploaded["misaligned"].numpy().max() == 0.0 and uploaded["strided"].numpy().max() == 0.0


@pytest.mark.parametrize("case", LAYER_CASES)
def test_step_ops_are_exactly_what_the_bound_layers_launch(case):
    """`step_ops` (what a build must contain) and the bound layers' launches name the same kernels."""
    stack = make_stack(case, ("gdn", "attention"), seed=0)
    for layer in stack.layers:
        assert sorted(set(layer.launched)) == sorted(step_ops(stack.cfg, (layer.kind,)))


class _FakeCudart:
    """The cuda-bindings runtime calls CudaGraph makes, with a capture that records `nodes` nodes (no GPU)."""

    class cudaStreamCaptureMode:  # noqa: N801 (the bindings' name)
        cudaStreamCaptureModeThreadLocal = 1

    def __init__(self, nodes: int):
        self.nodes = nodes

    def cudaGraphGetNodes(self, graph, count):  # noqa: N802
        return 0, [], self.nodes

    def __getattr__(self, name):  # every other call succeeds, returning a handle
        return lambda *args: (0, 7)


@pytest.mark.parametrize("nodes", [0, 2])
def test_graph_capture_missing_launches_is_an_error(monkeypatch, nodes):
    """A capture holding fewer nodes than the plan's calls (a call launched on another stream ran once, eagerly,
    and replays would skip it) raises instead of replaying a partial step."""
    import cuda.bindings

    from gdn_tvm.runtime.graph import CudaGraph

    monkeypatch.setattr(cuda.bindings, "runtime", _FakeCudart(nodes))
    with pytest.raises(RuntimeError, match=f"recorded {nodes} nodes for 3 kernel calls"):
        CudaGraph(lambda: None, 3)
    assert CudaGraph(lambda: None, nodes).exec == 7  # as many nodes as calls: instantiated


@pytest.mark.parametrize("dtype", ["float32", "int64", "bfloat16"])
def test_fill_and_write_row_go_through_small_host_buffers(dtype, monkeypatch):
    """`fill` (a state pool zeroed at binding, a slot reset) writes from host buffers of at most `FILL_CHUNK` bytes,
    so a whole KV cache is never copied from the host: set to 3 elements a copy here, every element in the range
    and none outside it is written."""
    monkeypatch.setattr(layers, "FILL_CHUNK", 3 * np.dtype(dtype).itemsize)
    values = np.arange(20).reshape(4, 5).astype(dtype)
    tensor = tvm.runtime.tensor(values)
    layers.write_row(tensor, 2, -1)
    layers.fill(tensor, 7, start=3, count=4)
    values[2] = -1
    values.reshape(-1)[3:7] = 7
    assert np.array_equal(tensor.numpy(), values)
    layers.fill(tensor, 0)
    assert not tensor.numpy().any()
