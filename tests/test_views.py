"""Row views (runtime/views.py): what a B = 1 step binds for each part of a stacked projection."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tvm
from conftest import F32

from gdn_tvm.config import STACKED, DecodeConfig, preset
from gdn_tvm.plan import attention, fusions, model, step_ops
from gdn_tvm.runtime.views import row_view
from gdn_tvm.runtime.weights import random_weights, unstack, upload
from gdn_tvm.signature import ArgumentError


def test_row_view_shares_the_base_and_outlives_its_python_handle():
    base = tvm.runtime.tensor(np.arange(96, dtype=np.float32).reshape(1, 96))
    view = row_view(base, 32, (2, 8))
    assert view.shape == (2, 8) and view.data_ptr() == base.data_ptr() + 128
    np.testing.assert_array_equal(view.numpy(), np.arange(32, 48, dtype=np.float32).reshape(2, 8))
    base.copyfrom(np.zeros((1, 96), np.float32))
    assert not view.numpy().any()  # the same memory
    del view
    gc.collect()  # the DLPack deleter frees the view's own block, not the base
    assert base.numpy().shape == (1, 96)


@pytest.mark.parametrize(("start", "shape", "match"), [(80, (1, 32), "outside"), (4, (1, 16), "aligned")])
def test_row_view_rejects_a_range_outside_or_misaligned(start, shape, match):
    base = tvm.runtime.tensor(np.zeros((1, 96), np.float32))
    with pytest.raises(ArgumentError, match=match):
        row_view(base, start, shape)


@pytest.mark.parametrize("kind", ["numpy", "torch", "tvm"])
def test_upload_stacks_on_the_device_and_unstack_inverts_it(rng, kind):
    """Each part's rows land in the stacked tensor from wherever they live; the other weights are shared."""
    m = preset("qwen3.5-0.8b")
    w = random_weights(m, "attention", rng)
    given = {n: _as(kind, a) for n, a in w.items()}
    stacked = upload(given, attention(DecodeConfig(m, **F32)).weights, tvm.cpu(), {"qkv_proj": STACKED["qkv_proj"]})
    assert set(stacked) == set(w) - set(STACKED["qkv_proj"]) | {"qkv_proj"}
    assert stacked["qkv_proj"].shape == m.projections["qkv_proj"]
    np.testing.assert_array_equal(stacked["qkv_proj"].numpy(), np.concatenate([w[p] for p in STACKED["qkv_proj"]]))
    back = unstack(m, {n: t.numpy() for n, t in stacked.items()})
    for name in w:
        np.testing.assert_array_equal(back[name], w[name])


def _as(kind: str, a: np.ndarray):
    if kind == "torch":
        import torch

        return torch.from_numpy(a)
    return tvm.runtime.tensor(a) if kind == "tvm" else a


def test_every_preset_stacks_its_projections_at_b1_only():
    for name in ("qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-27b", "qwen3-next-80b-a3b"):
        one, two = DecodeConfig(preset(name), **F32), DecodeConfig(preset(name), batch=2, **F32)
        assert fusions(one).stacked == set(STACKED) and not fusions(two).stacked
        assert "gemv_in_proj_conv" in step_ops(one) and "gemv_in_proj_qkv" in step_ops(two)
        assert step_ops(one, ("gdn",)) == ["gemv_in_proj_conv", "delta_rule_fused", "gemv_out_proj_norm"]
        assert len(step_ops(two, ("gdn",))) == 8


@pytest.mark.parametrize("name", ["qwen3.5-0.8b", "qwen3.5-4b"])
def test_block_stages_take_the_layer_norms_into_the_gemvs_at_b1(name):
    """At B = 1 no norm runs inside the layers (the GEMVs reading the residual stream normalise it, those writing a
    sublayer's output add into it in place), where the B = 2 plan launches two norms a layer."""
    one, two = DecodeConfig(preset(name), **F32), DecodeConfig(preset(name), batch=2, **F32)
    assert fusions(one).block_stages and not fusions(two).block_stages
    fused, plain = model(one), model(two)
    assert "add_rmsnorm" not in fused.ops and fused.ops.count("rmsnorm") == 1
    layers = len(one.model.layer_types)
    assert sum(launch.op == "rmsnorm" for launch in fused.launches) == 1
    assert sum(launch.op == "add_rmsnorm" for launch in plain.launches) == 2 * layers
    residual_writers = [launch for launch in fused.launches if launch.op.endswith("_residual")]
    assert len(residual_writers) == 2 * layers and all(
        launch.args["residual"] == "hidden" for launch in residual_writers
    )
    for launch in fused.launches:
        if launch.op.startswith("gemv_") and "_rmsnorm" in launch.op:
            assert launch.args["x"] == "hidden" and launch.args["norm_weight"].endswith("layernorm")
