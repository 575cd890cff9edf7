"""delta_rule specifics: both head mappings, untouched pool slots, several steps through the state, CUDA shape."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import F32, assert_close, cuda_source

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import HEAD_MAPPINGS, DecodeConfig, preset
from gdn_tvm.reference.delta_rule import delta_rule
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.verify import TOL_OP, reference_copy

OP = OPS["delta_rule"]
B3 = DecodeConfig(preset("qwen3.5-4b"), batch=3, slots=5, **F32)  # Hv = 2*Hk: the two mappings differ


def _inputs(cfg: DecodeConfig, rng: np.random.Generator) -> dict:
    return {a.name: sample(a, rng) for a in visible(OP.signature(cfg))}


def _run(cfg: DecodeConfig, values: dict) -> None:
    """The llvm kernel on aligned copies; `o` and `state` are copied back into `values`."""
    tensors = {k: tvm.runtime.tensor(v) for k, v in values.items()}
    compile_op(OP, cfg, llvm())(**tensors)
    for name in ("o", "state"):
        values[name][...] = tensors[name].numpy()


def _reference(values: dict, mapping: str) -> dict:
    expect = reference_copy(values)
    delta_rule(**expect, head_mapping=mapping)
    return expect


@pytest.mark.parametrize("mapping", HEAD_MAPPINGS)
def test_head_mapping_matches_reference(mapping, rng):
    cfg = B3.replace(head_mapping=mapping)
    values = _inputs(cfg, rng)
    expect = _reference(values, mapping)
    other = _reference(values, next(m for m in HEAD_MAPPINGS if m != mapping))
    _run(cfg, values)
    for name in ("o", "state"):
        assert_close(values[name], expect[name], TOL_OP, f"delta_rule[{mapping}].{name}")
    with pytest.raises(AssertionError, match="relative L-inf error"):
        assert_close(values["o"], other["o"], TOL_OP, "the other mapping")


def test_skipped_lane_and_unused_slots_bit_identical(rng):
    values = _inputs(B3, rng)
    values["slots"] = np.array([3, -1, 0], np.int32)
    before = values["state"].copy()
    _run(B3, values)
    untouched = [1, 2, 4]
    assert np.array_equal(values["state"][untouched], before[untouched]), "a slot no lane uses was modified"
    assert np.isnan(values["o"][1]).all(), "the skipped lane's output was written"
    assert not np.isnan(values["o"][[0, 2]]).any()


def test_steps_carried_through_state(rng):
    cfg = DecodeConfig(preset("qwen3.5-4b"), batch=3, slots=4, **F32).replace(head_mapping="tiled")
    state = _inputs(cfg, rng)["state"]
    ref_state = state.astype(np.float64)
    for step in range(8):
        values = _inputs(cfg, rng) | {"state": state}
        expect = reference_copy(values) | {"state": ref_state}
        delta_rule(**expect, head_mapping="tiled")
        _run(cfg, values)
        assert_close(values["o"], expect["o"], TOL_OP, f"step {step}: o")
    assert_close(state, ref_state, TOL_OP, "state after 8 steps")


KNOBS = [
    {},
    {"row_groups": 8, "rows_per_group": 1},
    {"row_groups": 2, "rows_per_group": 4, "lanes": 16},
    {"row_groups": 1, "rows_per_group": 8, "stores_last": 1},
    {"vector": 2},
]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(f"{n}{v}" for n, v in k.items()) or "default")
def test_cuda_state_streamed_once_in_vectors(knobs):
    """Every state access is a `vector`-wide load or store (no scalar path), reductions are warp shuffles."""
    cfg = DecodeConfig(preset("qwen3.5-4b"), batch=32, **F32)
    src = cuda_source(OP.name, cfg, **knobs)
    width = knobs.get("vector", 4)
    for ptr in ("state_ptr", "state_out_ptr"):
        assert f"*(float{width}*)({ptr} +" in src, f"{ptr}: no float{width} access"
        assert f"{ptr}[" not in src, f"{ptr}: scalar access"
    assert "__shfl_down_sync" in src
    assert "__shared__" not in src
