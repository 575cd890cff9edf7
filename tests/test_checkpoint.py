"""The Hugging Face checkpoint loader, on small checkpoints the tests write in that format."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import tvm
from safetensors.numpy import save_file
from test_layers import assert_decodes_like_reference

from gdn_tvm.build.compile import build_kernels
from gdn_tvm.config import DecodeConfig
from gdn_tvm.runtime.checkpoint import load_checkpoint
from gdn_tvm.runtime.layers import kernel_names
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.runtime.weights import SHAPES
from gdn_tvm.signature import ArgumentError
from gdn_tvm.target import llvm

HF_CONFIG = {
    "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
    "linear_num_key_heads": 1, "linear_num_value_heads": 2, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "head_dim": 256, "rms_norm_eps": 1e-6, "full_attention_interval": 4,
    "rope_parameters": {"rope_theta": 5e6, "partial_rotary_factor": 0.25},
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}  # fmt: skip


def write_checkpoint(path, rng, fused: bool, prefix: str, dtype=np.float32) -> dict:
    """A 4-layer checkpoint (3 GDN + 1 attention); returns the raw tensors written."""
    c = HF_CONFIG
    hid, hk, hv, dk, dv, d = 64, 1, 2, 128, 128, 256
    conv_dim = 2 * hk * dk + hv * dv
    t = {}
    for i in range(3):
        p = f"{prefix}{i}.linear_attn."
        if fused:
            t[p + "in_proj_qkvz.weight"] = rng.standard_normal((hk * (2 * dk + 2 * (hv // hk) * dv), hid))
            t[p + "in_proj_ba.weight"] = rng.standard_normal((2 * hv, hid))
        else:
            t[p + "in_proj_qkv.weight"] = rng.standard_normal((conv_dim, hid))
            t[p + "in_proj_z.weight"] = rng.standard_normal((hv * dv, hid))
            t[p + "in_proj_b.weight"] = rng.standard_normal((hv, hid))
            t[p + "in_proj_a.weight"] = rng.standard_normal((hv, hid))
        t[p + "conv1d.weight"] = rng.standard_normal((conv_dim, 1, 4))
        t[p + "dt_bias"] = rng.standard_normal(hv)
        t[p + "A_log"] = rng.standard_normal(hv)
        t[p + "norm.weight"] = rng.standard_normal(dv)
        t[p + "out_proj.weight"] = rng.standard_normal((hid, hv * dv))
    p = f"{prefix}3.self_attn."
    t[p + "q_proj.weight"] = rng.standard_normal((2 * 2 * d, hid))
    for n in ("k_proj", "v_proj"):
        t[p + f"{n}.weight"] = rng.standard_normal((d, hid))
    t[p + "o_proj.weight"] = rng.standard_normal((hid, 2 * d))
    t[p + "q_norm.weight"], t[p + "k_norm.weight"] = rng.standard_normal(d), rng.standard_normal(d)
    # projections scaled like trained weights (1/sqrt(fan-in)) so decoding stays in range
    t = {k: (v / np.sqrt(v.shape[-1]) if v.ndim == 2 else v).astype(dtype) for k, v in t.items()}
    save_file(t, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({"text_config": c} if prefix.startswith("model.language") else c))
    return t


@pytest.mark.parametrize("prefix", ["model.language_model.layers.", "model.layers."])
def test_loader_converts_qwen35_names(tmp_path, rng, prefix):
    raw = write_checkpoint(tmp_path, rng, fused=False, prefix=prefix, dtype=ml_dtypes.bfloat16)
    m, layers = load_checkpoint(tmp_path)
    assert (m.hidden, m.n_k_heads, m.n_v_heads, m.n_q_heads, m.n_kv_heads, m.rope_theta) == (64, 1, 2, 2, 1, 5e6)
    assert m.layer_types == ("gdn", "gdn", "gdn", "attention")
    f32 = {k: v.astype(np.float32) for k, v in raw.items()}
    g = layers[1]
    assert np.array_equal(g["A"], -np.exp(f32[f"{prefix}1.linear_attn.A_log"]))
    assert np.array_equal(g["conv1d"], f32[f"{prefix}1.linear_attn.conv1d.weight"][:, 0])
    assert np.array_equal(g["in_proj_qkv"], f32[f"{prefix}1.linear_attn.in_proj_qkv.weight"])
    assert np.array_equal(layers[3]["q_norm"], 1.0 + f32[f"{prefix}3.self_attn.q_norm.weight"])
    for kind, w in zip(m.layer_types, layers, strict=True):
        assert {k: v.shape for k, v in w.items()} == SHAPES[kind](m)
        assert all(v.dtype == np.float32 for v in w.values())


def test_loader_splits_qwen3_next_fused_projections(tmp_path, rng):
    raw = write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.")
    m, layers = load_checkpoint(tmp_path)
    qkvz = raw["model.layers.0.linear_attn.in_proj_qkvz.weight"]
    ba = raw["model.layers.0.linear_attn.in_proj_ba.weight"]
    # one key head, r = 2 value heads: rows [q 128 | k 128 | v 256 | z 256], [b 2 | a 2]
    assert np.array_equal(layers[0]["in_proj_qkv"], qkvz[:512])
    assert np.array_equal(layers[0]["in_proj_z"], qkvz[512:])
    assert np.array_equal(layers[0]["in_proj_b"], ba[:2]) and np.array_equal(layers[0]["in_proj_a"], ba[2:])


def test_missing_and_misshaped_tensors_are_named(tmp_path, rng):
    raw = write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    name = "model.layers.2.linear_attn.dt_bias"
    save_file({k: v for k, v in raw.items() if k != name}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ArgumentError, match=name):
        load_checkpoint(tmp_path)
    name = "model.layers.3.self_attn.k_proj.weight"
    save_file(raw | {name: raw[name][:, :-1].copy()}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ArgumentError, match=f"{name} has shape"):
        load_checkpoint(tmp_path)


def test_loaded_checkpoint_decodes_against_reference(tmp_path, rng):
    """The loader's output drives the executor: 4 steps of the checkpoint's 4 layers on llvm vs the reference."""
    write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.")
    m, layers = load_checkpoint(tmp_path)
    cfg = DecodeConfig(m, batch=1, max_len=16, split_len=8)
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), kernel_names(cfg)), tvm.cpu(), weights=layers)
    assert_decodes_like_reference(stack, rng, steps=4)
