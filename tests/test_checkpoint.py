"""The Hugging Face checkpoint loader, on small checkpoints the tests write in that format."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import tvm
from safetensors.numpy import save_file
from test_layers import assert_decodes_like_reference

from gdn_tvm.codegen.compile import build_kernels
from gdn_tvm.config import PRESETS, DecodeConfig
from gdn_tvm.plan import WEIGHTS, step_ops
from gdn_tvm.runtime.checkpoint import load_checkpoint, model_config
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.signature import ArgumentError
from gdn_tvm.target import llvm

HF_CONFIG = {
    "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "head_dim": 256, "rms_norm_eps": 1e-6, "full_attention_interval": 4,
    "rope_parameters": {"rope_theta": 5e6, "partial_rotary_factor": 0.25},
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}  # fmt: skip
HID, HK, HV, DK, DV, D = 64, 2, 4, 128, 128, 256  # HF_CONFIG's sizes; two key heads, so head order matters


def write_checkpoint(path, rng, fused: bool, prefix: str, dtype=np.float32) -> dict:
    """A 4-layer checkpoint (3 GDN + 1 attention) of HF_CONFIG's sizes; returns the raw tensors written."""
    conv_dim = 2 * HK * DK + HV * DV
    t = {}
    for i in range(3):
        p = f"{prefix}{i}.linear_attn."
        if fused:
            t[p + "in_proj_qkvz.weight"] = rng.standard_normal((HK * (2 * DK + 2 * (HV // HK) * DV), HID))
            t[p + "in_proj_ba.weight"] = rng.standard_normal((2 * HV, HID))
        else:
            t[p + "in_proj_qkv.weight"] = rng.standard_normal((conv_dim, HID))
            t[p + "in_proj_z.weight"] = rng.standard_normal((HV * DV, HID))
            t[p + "in_proj_b.weight"] = rng.standard_normal((HV, HID))
            t[p + "in_proj_a.weight"] = rng.standard_normal((HV, HID))
        t[p + "conv1d.weight"] = rng.standard_normal((conv_dim, 1, 4))
        t[p + "dt_bias"] = rng.standard_normal(HV)
        t[p + "A_log"] = rng.standard_normal(HV)
        t[p + "norm.weight"] = rng.standard_normal(DV)
        t[p + "out_proj.weight"] = rng.standard_normal((HID, HV * DV))
    p = f"{prefix}3.self_attn."
    t[p + "q_proj.weight"] = rng.standard_normal((2 * 2 * D, HID))
    for n in ("k_proj", "v_proj"):
        t[p + f"{n}.weight"] = rng.standard_normal((D, HID))
    t[p + "o_proj.weight"] = rng.standard_normal((HID, 2 * D))
    t[p + "q_norm.weight"], t[p + "k_norm.weight"] = rng.standard_normal(D), rng.standard_normal(D)
    # projections scaled like trained weights (1/sqrt(fan-in)) so decoding stays in range
    t = {k: (v / np.sqrt(v.shape[-1]) if v.ndim == 2 else v).astype(dtype) for k, v in t.items()}
    save_file(t, str(path / "model.safetensors"))
    write_config(path, HF_CONFIG, nested=prefix.startswith("model.language"))
    return t


def write_config(path, config: dict, nested: bool) -> None:
    """config.json, under `text_config` as Qwen3.5's official checkpoints have it when `nested`."""
    (path / "config.json").write_text(json.dumps({"text_config": config} if nested else config))


def expected_weights(raw: dict, prefix: str, fused: bool) -> list[dict]:
    """What the loader must return, computed row by row from the checkpoint's own layout (SPEC.md, "Checkpoint
    names"): Qwen3-Next's fused rows are, per key head h, [q_h | k_h | v_h (r heads) | z_h (r heads)] and
    [b_h (r) | a_h (r)]; the channel order we use is [q_0 q_1 .. | k_0 k_1 .. | v ..]."""
    f32 = {k: v.astype(np.float32) for k, v in raw.items()}
    layers = []
    for i in range(3):
        p = f"{prefix}{i}.linear_attn."
        if fused:
            r, qkvz, ba = HV // HK, f32[p + "in_proj_qkvz.weight"], f32[p + "in_proj_ba.weight"]
            per, q, k, v, z, b, a = 2 * DK + 2 * r * DV, [], [], [], [], [], []
            for h in range(HK):
                rows = qkvz[h * per : (h + 1) * per]
                q.append(rows[:DK]), k.append(rows[DK : 2 * DK])
                v.append(rows[2 * DK : 2 * DK + r * DV]), z.append(rows[2 * DK + r * DV :])
                b.append(ba[h * 2 * r : h * 2 * r + r]), a.append(ba[h * 2 * r + r : (h + 1) * 2 * r])
            proj = {"in_proj_qkv": np.concatenate(q + k + v), "in_proj_z": np.concatenate(z)}
            proj |= {"in_proj_b": np.concatenate(b), "in_proj_a": np.concatenate(a)}
        else:
            proj = {n: f32[p + f"{n}.weight"] for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")}
        layers.append(
            proj
            | {
                "conv1d": f32[p + "conv1d.weight"][:, 0],
                "dt_bias": f32[p + "dt_bias"],
                "A": -np.exp(f32[p + "A_log"]),
                "norm": f32[p + "norm.weight"],  # the gated RMSNorm's weight is used as stored
                "out_proj": f32[p + "out_proj.weight"],
            }
        )
    p = f"{prefix}3.self_attn."
    attn = {n: f32[p + f"{n}.weight"] for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    layers.append(attn | {n: 1.0 + f32[p + f"{n}.weight"] for n in ("q_norm", "k_norm")})
    return layers


@pytest.mark.parametrize(
    "prefix, fused", [("model.language_model.layers.", False), ("model.layers.", False), ("model.layers.", True)]
)
def test_loader_converts_every_tensor(tmp_path, rng, prefix, fused):
    raw = write_checkpoint(tmp_path, rng, fused=fused, prefix=prefix, dtype=ml_dtypes.bfloat16)
    m, layers = load_checkpoint(tmp_path)
    assert (m.hidden, m.n_k_heads, m.n_v_heads, m.n_q_heads, m.n_kv_heads, m.rope_theta) == (64, 2, 4, 2, 1, 5e6)
    assert m.layer_types == ("gdn", "gdn", "gdn", "attention") and m.name == tmp_path.name
    for kind, got, want in zip(m.layer_types, layers, expected_weights(raw, prefix, fused), strict=True):
        assert {k: v.shape for k, v in got.items()} == WEIGHTS[kind](m)
        assert sorted(got) == sorted(want)
        for name, value in got.items():
            assert value.dtype == np.float32 and np.array_equal(value, want[name]), f"{kind} {name}"


@pytest.mark.parametrize("nested", [False, True])
def test_a_checkpoint_of_a_presets_sizes_is_named_after_it(tmp_path, nested):
    """So that the modules `make build --preset` exported for that preset load for the checkpoint."""
    m = PRESETS["qwen3.5-0.8b"]
    config = {
        "hidden_size": m.hidden, "num_hidden_layers": m.n_layers, "num_attention_heads": m.n_q_heads,
        "num_key_value_heads": m.n_kv_heads, "linear_num_key_heads": m.n_k_heads,
        "linear_num_value_heads": m.n_v_heads, "linear_key_head_dim": m.head_k_dim,
        "linear_value_head_dim": m.head_v_dim, "linear_conv_kernel_dim": m.conv_kernel, "head_dim": m.head_dim,
        "rms_norm_eps": m.rms_norm_eps, "full_attention_interval": m.full_attention_interval,
        "rope_parameters": {"rope_theta": m.rope_theta, "partial_rotary_factor": m.partial_rotary_factor},
    }  # fmt: skip
    as_given = {"text_config": config} if nested else config
    assert model_config(as_given, "Qwen3.5-0.8B") == m
    config["rope_parameters"]["rope_theta"] = 1e6
    assert model_config(as_given, "Qwen3.5-0.8B").name == "Qwen3.5-0.8B"
    del config["rope_parameters"]
    with pytest.raises(ArgumentError, match="rope_theta"):
        model_config(as_given, "Qwen3.5-0.8B")


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
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), weights=layers)
    assert_decodes_like_reference(stack, rng, steps=4)
