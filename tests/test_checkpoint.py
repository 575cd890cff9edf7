"""The Hugging Face checkpoint loader, on small checkpoints the tests write in that format."""

from __future__ import annotations

import json
import re
import struct

import ml_dtypes
import numpy as np
import pytest
import tvm
from safetensors import safe_open
from safetensors.numpy import save_file
from test_layers import assert_decodes_like_reference

from gdn_tvm.codegen.compile import build_kernels
from gdn_tvm.config import PRESETS, DecodeConfig
from gdn_tvm.plan import WEIGHTS, step_ops, stored_dtype
from gdn_tvm.runtime.checkpoint import CheckpointError, load_checkpoint, model_config
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.signature import ArgumentError
from gdn_tvm.target import llvm

HF_CONFIG = {
    "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "head_dim": 256, "rms_norm_eps": 1e-6, "full_attention_interval": 4,
    "vocab_size": 320, "intermediate_size": 96, "rope_parameters": {"rope_theta": 5e6, "partial_rotary_factor": 0.25},
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
}  # fmt: skip
HID, HK, HV, DK, DV, D = 64, 2, 4, 128, 128, 256  # HF_CONFIG's sizes; two key heads, so head order matters
VOCAB, MLP = 320, 96


def write_checkpoint(path, rng, fused: bool, prefix: str, dtype=np.float32) -> dict:
    """A 4-layer checkpoint (3 GDN + 1 attention) of HF_CONFIG's sizes, with its norms, MLPs, embedding and (untied)
    LM head; returns the raw tensors written."""
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
    for i in range(4):
        p = f"{prefix}{i}."
        t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"] = rng.standard_normal((2, HID))
        t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = rng.standard_normal((2, MLP, HID))
        t[p + "mlp.down_proj.weight"] = rng.standard_normal((HID, MLP))
    model = prefix.removesuffix("layers.")
    t[model + "embed_tokens.weight"], t["lm_head.weight"] = rng.standard_normal((2, VOCAB, HID))
    t[model + "norm.weight"] = rng.standard_normal(HID)
    # projections scaled like trained weights (1/sqrt(fan-in)) so decoding stays in range
    t = {k: (v / np.sqrt(v.shape[-1]) if v.ndim == 2 else v).astype(dtype) for k, v in t.items()}
    save_file(t, str(path / "model.safetensors"))
    write_config(path, HF_CONFIG, nested=prefix.startswith("model.language"))
    return t


def write_config(path, config: dict, nested: bool) -> None:
    """config.json, under `text_config` as Qwen3.5's official checkpoints have it when `nested`."""
    (path / "config.json").write_text(json.dumps({"text_config": config} if nested else config))


DELETE = object()  # `with_field`'s value that removes the field


def with_field(config: dict, field: str, value: object) -> dict:
    """A deep copy of `config` with the field at dotted path `field` set to `value` (removed for `DELETE`)."""
    config = json.loads(json.dumps(config))
    *parents, leaf = field.split(".")
    section = config
    for key in parents:
        section = section[key]
    if value is DELETE:
        del section[leaf]
    else:
        section[leaf] = value
    return config


def split_header(data: bytes) -> tuple[dict, bytes]:
    """A safetensors file's header (tensor name -> dtype, shape, data_offsets) and its data bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def join_header(header: dict, body: bytes) -> bytes:
    """The inverse of `split_header`."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def expected_weights(raw: dict, prefix: str, fused: bool) -> list[dict]:
    """What the loader must return, computed row by row from the checkpoint's own layout (docs/math.md, "Checkpoint
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
    layers.append(attn | {n: f32[p + f"{n}.weight"] for n in ("q_norm", "k_norm")})  # zero-centred, as stored
    return layers


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "prefix, fused", [("model.language_model.layers.", False), ("model.layers.", False), ("model.layers.", True)]
)
def test_loader_converts_every_tensor(tmp_path, rng, prefix, fused, weight_dtype):
    """A bf16 checkpoint: float32 weights for a float32 stack; for a bf16 one, the stored bf16 values as they are
    (A computed in float32; A and dt_bias stay float32; the zero-centred q/k norms as stored)."""
    raw = write_checkpoint(tmp_path, rng, fused=fused, prefix=prefix, dtype=ml_dtypes.bfloat16)
    loaded = load_checkpoint(tmp_path, weight_dtype)
    m, layers = loaded.model, loaded.layers
    assert (m.hidden, m.n_k_heads, m.n_v_heads, m.n_q_heads, m.n_kv_heads, m.rope_theta) == (64, 2, 4, 2, 1, 5e6)
    assert m.layer_types == ("gdn", "gdn", "gdn", "attention") and m.name == tmp_path.name
    for kind, got, want in zip(m.layer_types, layers, expected_weights(raw, prefix, fused), strict=True):
        assert {k: v.shape for k, v in got.items()} == WEIGHTS[kind](m)
        assert sorted(got) == sorted(want)
        for name, value in got.items():
            dtype = stored_dtype(name, weight_dtype)
            assert value.dtype == dtype and np.array_equal(value, want[name].astype(dtype)), f"{kind} {name}"
            assert value.flags.c_contiguous, f"{kind} {name}"


def test_default_keeps_bf16_as_stored(tmp_path, rng):
    """bf16 is the default storage: a bf16 checkpoint loads as its own bf16 values (A and dt_bias in float32), the
    arrays a default `DecodeConfig` stack takes."""
    raw = write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.", dtype=ml_dtypes.bfloat16)
    assert DecodeConfig(PRESETS["qwen3.5-0.8b"]).weight_dtype == "bfloat16"
    layers = load_checkpoint(tmp_path).layers
    for got, want in zip(layers, expected_weights(raw, "model.layers.", fused=True), strict=True):
        for name, value in got.items():
            dtype = stored_dtype(name, "bfloat16")
            assert value.dtype == dtype and np.array_equal(value, want[name].astype(dtype)), name


@pytest.mark.parametrize("weight_dtype", ["float32", "bfloat16"])
def test_zero_centred_norm_weights_come_through_as_stored(tmp_path, rng, weight_dtype):
    """The q/k norms, both layer norms and the final norm of a bf16 checkpoint: its bits as they are in a bf16 stack,
    widened exactly in a float32 one; no `1 + w` (the kernels add the 1 in float32)."""
    raw = write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.", dtype=ml_dtypes.bfloat16)
    loaded = load_checkpoint(tmp_path, weight_dtype).arrays()
    names = {"norm": "model.norm.weight"}
    names |= {f"layers.3.{n}": f"model.layers.3.self_attn.{n}.weight" for n in ("q_norm", "k_norm")}
    for i in range(4):
        names |= {
            f"blocks.{i}.{n}": f"model.layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")
        }
    for name, key in names.items():
        got, want = loaded[name], raw[key].astype(weight_dtype)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name


def test_a_weight_dtype_outside_the_table_is_refused_by_name(tmp_path, rng):
    write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    for dtype in ("float16", ["bfloat16"], None):
        with pytest.raises(ArgumentError, match="weight_dtype: expected one of"):
            load_checkpoint(tmp_path, dtype)


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
        "vocab_size": m.vocab_size, "intermediate_size": m.intermediate_size,
    }  # fmt: skip
    as_given = {"text_config": config} if nested else config
    assert model_config(as_given, "Qwen3.5-0.8B").name == "Qwen3.5-0.8B"  # untied: not the preset
    as_given["tie_word_embeddings"] = True  # where Hugging Face reads it: the top level
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


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loaded_checkpoint_decodes_against_reference(tmp_path, rng, dtype):
    """The loader's output drives the executor: 4 steps of the checkpoint's 4 layers on llvm vs the reference."""
    write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.", dtype=ml_dtypes.bfloat16)
    loaded = load_checkpoint(tmp_path, dtype)
    cfg = DecodeConfig(loaded.model, batch=1, max_len=16, split_len=8, weight_dtype=dtype, kv_dtype=dtype)
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), weights=loaded.layers)
    assert_decodes_like_reference(stack, rng, steps=4)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_floating_dtypes_load_as_float32(tmp_path, rng, dtype):
    raw = write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.", dtype=dtype)
    layers = load_checkpoint(tmp_path, "float32").layers
    for got, want in zip(layers, expected_weights(raw, "model.layers.", fused=True), strict=True):
        assert all(got[k].dtype == np.float32 and np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize(
    "dtype, name",
    [
        (np.int8, "I8"), (np.int32, "I32"), (np.uint8, "U8"), (np.bool_, "BOOL"),
        (ml_dtypes.float8_e4m3fn, "F8_E4M3"), (ml_dtypes.float8_e5m2, "F8_E5M2"),
    ],
)  # fmt: skip
def test_non_floating_tensors_are_refused_by_name_and_dtype(tmp_path, rng, dtype, name):
    """A quantized checkpoint is refused, not cast to float."""
    raw = write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    key = "model.layers.1.linear_attn.in_proj_z.weight"
    save_file(raw | {key: raw[key].astype(dtype)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"model.safetensors: tensor {re.escape(key)} has dtype {name}"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(
    "name, value",
    [("model.layers.0.linear_attn.norm.weight", np.nan), ("model.layers.1.linear_attn.A_log", 100.0)],
    ids=["nan", "exp(A_log) overflows"],
)
def test_values_that_are_not_finite_as_weights_are_named(tmp_path, rng, name, value):
    raw = write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    raw[name][1] = value
    save_file(raw, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"{re.escape(name)} holds NaN or inf"):
        load_checkpoint(tmp_path)


def test_shards_load_together_and_a_tensor_in_two_is_refused(tmp_path, rng):
    raw = write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.")
    whole = load_checkpoint(tmp_path).arrays()
    names = sorted(raw)
    (tmp_path / "model.safetensors").unlink()
    first, second = tmp_path / "model-00001-of-00002.safetensors", tmp_path / "model-00002-of-00002.safetensors"
    save_file({k: raw[k] for k in names[:10]}, str(first))
    save_file({k: raw[k] for k in names[10:]}, str(second))
    sharded = load_checkpoint(tmp_path).arrays()
    assert sorted(sharded) == sorted(whole) and all(np.array_equal(whole[k], sharded[k]) for k in whole)
    save_file({k: raw[k] for k in names[9:]}, str(second))
    with pytest.raises(CheckpointError, match=f"{re.escape(f'{first}, {second}: both hold tensor {names[9]}')}$"):
        load_checkpoint(tmp_path)


def test_an_index_names_the_shards_read_and_each_must_exist(tmp_path, rng):
    """With model.safetensors.index.json the shards of its weight_map are read and a stray file beside them is not;
    a shard it names that is missing, or an index that is not one, is refused naming the index."""
    raw = write_checkpoint(tmp_path, rng, fused=True, prefix="model.layers.")
    whole = load_checkpoint(tmp_path).arrays()
    names = sorted(raw)
    (tmp_path / "model.safetensors").unlink()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    save_file({k: raw[k] for k in names[:10]}, str(tmp_path / shards[0]))
    save_file({k: raw[k] for k in names[10:]}, str(tmp_path / shards[1]))
    save_file({names[0]: raw[names[0]]}, str(tmp_path / "stray-backup.safetensors"))  # not in the index
    index = tmp_path / "model.safetensors.index.json"
    weight_map = {k: shards[i >= 10] for i, k in enumerate(names)}
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    indexed = load_checkpoint(tmp_path).arrays()
    assert sorted(indexed) == sorted(whole) and all(np.array_equal(whole[k], indexed[k]) for k in whole)
    (tmp_path / shards[1]).unlink()
    with pytest.raises(CheckpointError, match=rf"index\.json: weight_map names '{shards[1]}', which is not a file"):
        load_checkpoint(tmp_path)
    for text, message in (("{not json", "not a JSON file"), ('{"weight_map": [1]}', "weight_map: expected an object")):
        index.write_text(text)
        with pytest.raises(CheckpointError, match=rf"^{re.escape(str(index))}: {message}"):
            load_checkpoint(tmp_path)
    index.write_text(json.dumps({"weight_map": {names[0]: "../model-00001-of-00002.safetensors"}}))
    with pytest.raises(CheckpointError, match="which is not a file beside it"):
        load_checkpoint(tmp_path)


BAD_CONFIG_FIELDS = {  # dotted field: a value it must refuse
    "hidden_size=64.0": ("hidden_size", 64.0),
    "hidden_size=true": ("hidden_size", True),
    "hidden_size='64'": ("hidden_size", "64"),
    "hidden_size=0": ("hidden_size", 0),
    "head_dim=[256]": ("head_dim", [256]),
    "num_hidden_layers=null": ("num_hidden_layers", None),
    "no linear_key_head_dim": ("linear_key_head_dim", DELETE),
    "rms_norm_eps='x'": ("rms_norm_eps", "x"),
    "rms_norm_eps=0": ("rms_norm_eps", 0),
    "rms_norm_eps=nan": ("rms_norm_eps", float("nan")),
    "rms_norm_eps=inf": ("rms_norm_eps", float("inf")),
    "full_attention_interval=0": ("full_attention_interval", 0),
    "full_attention_interval=4.0": ("full_attention_interval", 4.0),
    "full_attention_interval=2": ("full_attention_interval", 2),  # against layer_types
    "rope_theta=0": ("rope_parameters.rope_theta", 0),
    "rope_theta=1e400": ("rope_parameters.rope_theta", 10**400),
    "rope_theta=1e39": ("rope_parameters.rope_theta", 1e39),  # past float32, the kernels' literal
    "rms_norm_eps=1e39": ("rms_norm_eps", 1e39),
    "rms_norm_eps=1e-45": ("rms_norm_eps", 1e-45),  # a float32 subnormal, flushed to zero on the GPU
    "partial_rotary_factor=0": ("rope_parameters.partial_rotary_factor", 0),
    "partial_rotary_factor=1.5": ("rope_parameters.partial_rotary_factor", 1.5),
    "partial_rotary_factor: 3 dims": ("rope_parameters.partial_rotary_factor", 3 / 256),  # RoPE rotates pairs
    "partial_rotary_factor: 0 dims": ("rope_parameters.partial_rotary_factor", 1 / 512),
    "rope_parameters='x'": ("rope_parameters", "x"),
    "linear_num_value_heads=3": ("linear_num_value_heads", 3),  # not a multiple of linear_num_key_heads=2
    "num_key_value_heads=3": ("num_key_value_heads", 3),  # num_attention_heads=2 is not a multiple
    "layer_types of 3": ("layer_types", ["linear_attention"] * 3),
    "layer_types unknown": ("layer_types", ["linear_attention"] * 3 + ["sliding_attention"]),
    "layer_types=[1, 2, 3, 4]": ("layer_types", [1, 2, 3, 4]),
    "vocab_size=0": ("vocab_size", 0),
    "no vocab_size": ("vocab_size", DELETE),
    "intermediate_size='96'": ("intermediate_size", "96"),
    "no intermediate_size": ("intermediate_size", DELETE),
    "num_experts=-1": ("num_experts", -1),
    "num_experts=2.0": ("num_experts", 2.0),
    # what would change the computation into one the kernels do not make
    "hidden_act='gelu'": ("hidden_act", "gelu"),
    "rope_type='yarn'": ("rope_parameters.rope_type", "yarn"),
    "rope_scaling.type='linear'": ("rope_scaling", {"type": "linear", "factor": 2.0}),
    "attention_bias=true": ("attention_bias", True),
    "attention_bias=1": ("attention_bias", 1),
}


@pytest.mark.parametrize("field, value", BAD_CONFIG_FIELDS.values(), ids=BAD_CONFIG_FIELDS)
@pytest.mark.parametrize("nested", [False, True])
def test_config_fields_of_the_wrong_type_or_range_are_named(field, value, nested):
    config = with_field(HF_CONFIG, field, value)
    leaf = field.split(".")[-1]
    with pytest.raises(CheckpointError, match=rf"^config\.json: .*{leaf}"):
        model_config({"text_config": config} if nested else config, "x")


@pytest.mark.parametrize("value", ["true", 1, None])
@pytest.mark.parametrize("nested", [False, True])
def test_a_tie_flag_that_is_not_a_boolean_is_named(value, nested):
    config = {"text_config": HF_CONFIG} if nested else dict(HF_CONFIG)
    with pytest.raises(CheckpointError, match=r"^config\.json: tie_word_embeddings: expected true or false"):
        model_config(config | {"tie_word_embeddings": value}, "x")


def test_mixture_of_experts_configs_have_no_dense_mlp():
    """`num_experts` >= 1 (the -a3b models, Qwen3-Next): no dense MLP, whatever `intermediate_size` says; the
    tie flag of a nested config is the top level's, not text_config's."""
    config = with_field(HF_CONFIG, "num_experts", 8)
    assert model_config(config, "x").intermediate_size is None
    assert model_config(with_field(config, "intermediate_size", DELETE), "x").intermediate_size is None
    assert model_config(with_field(HF_CONFIG, "num_experts", 0), "x").intermediate_size == 96
    nested = {"text_config": with_field(HF_CONFIG, "tie_word_embeddings", True)}
    assert not model_config(nested, "x").tie_word_embeddings
    assert model_config(nested | {"tie_word_embeddings": True}, "x").tie_word_embeddings


def test_config_variants_hf_writes_are_accepted():
    """Qwen3-Next's layout (rope fields at the top, rope_scaling null), ints for float fields, defaults for the
    optional fields; the values read are the ones given."""
    config = {k: v for k, v in HF_CONFIG.items() if k not in ("rope_parameters", "layer_types", "rms_norm_eps")}
    config |= {"rope_scaling": None, "rope_theta": 10_000_000, "partial_rotary_factor": 1, "layer_types": None}
    m = model_config(config, "x")
    assert (m.rope_theta, m.partial_rotary_factor, m.rms_norm_eps, m.full_attention_interval) == (1e7, 1.0, 1e-6, 4)
    del config["full_attention_interval"]
    assert model_config(config, "x").full_attention_interval == 4


@pytest.mark.parametrize(
    "content, match",
    [(b"{", "not a JSON file"), (b"\xff\xfe{}", "not a JSON file"), (b"[1, 2]", "expected a JSON object"),
     (b'{"text_config": 3}', "text_config: expected a JSON object"), (None, "no such file")],
    ids=["truncated", "not utf-8", "a list", "text_config=3", "a directory"],
)  # fmt: skip
def test_config_json_that_is_not_a_json_object_is_named(tmp_path, rng, content, match):
    write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    file = tmp_path / "config.json"
    file.unlink()
    file.mkdir() if content is None else file.write_bytes(content)
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(file))}: {match}"):
        load_checkpoint(tmp_path)


def test_a_layer_count_that_is_not_the_checkpoints_is_named(tmp_path, rng):
    write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    config = with_field(with_field(HF_CONFIG, "layer_types", DELETE), "num_hidden_layers", 10**6)
    write_config(tmp_path, config, nested=False)
    with pytest.raises(CheckpointError, match=r"config\.json: num_hidden_layers=1000000, but .* layers 0\.\.3"):
        load_checkpoint(tmp_path)
    write_config(tmp_path, with_field(config, "num_hidden_layers", 2**31), nested=False)
    with pytest.raises(CheckpointError, match=r"config\.json: num_hidden_layers: expected an integer in \[1, 2\^31\)"):
        load_checkpoint(tmp_path)


def _past_the_end(data: bytes) -> bytes:
    header, body = split_header(data)
    last = max(header.values(), key=lambda t: t["data_offsets"][1])
    last["data_offsets"][1] += 64
    return join_header(header, body)


CORRUPT_SHARDS = {  # how a valid model.safetensors (bytes) is damaged
    "empty": lambda d: b"",
    "cut in the length": lambda d: d[:5],
    "cut after the length": lambda d: d[:8],
    "cut in the header": lambda d: d[: 8 + struct.unpack("<Q", d[:8])[0] // 2],
    "cut in the data": lambda d: d[: len(d) // 2],
    "last byte missing": lambda d: d[:-1],
    "a byte too many": lambda d: d + b"\0",
    "random bytes": lambda d: np.random.default_rng(0).bytes(4096),
    "header not JSON": lambda d: struct.pack("<Q", 9) + b"{not json" + d[8:],
    "header a JSON list": lambda d: join_header([], b""),
    "header length past the end": lambda d: struct.pack("<Q", 2**40) + d[8:],
    "offsets past the end": _past_the_end,
}


@pytest.mark.parametrize("damage", CORRUPT_SHARDS.values(), ids=CORRUPT_SHARDS)
def test_a_corrupt_shard_is_named(tmp_path, rng, damage):
    write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.", dtype=ml_dtypes.bfloat16)
    file = tmp_path / "model.safetensors"
    file.write_bytes(damage(file.read_bytes()))
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(file))}: not a valid safetensors file"):
        load_checkpoint(tmp_path)


def test_a_directory_named_like_a_shard_is_named(tmp_path, rng):
    write_checkpoint(tmp_path, rng, fused=False, prefix="model.layers.")
    (tmp_path / "model-00002-of-00002.safetensors").mkdir()
    with pytest.raises(CheckpointError, match=f"^{re.escape(str(tmp_path))}/model-00002-of-00002.safetensors: not a"):
        load_checkpoint(tmp_path)


# 16 value heads: the stacked input projections' parts start 64-byte aligned, as the presets' do (B = 1 stacks them)
TINY = {
    "vocab_size": 320, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 16,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
}  # fmt: skip
VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}


def save_transformers_model(path, rng, multimodal: bool, tied: bool) -> dict[str, np.ndarray]:
    """A tiny random Qwen3.5 made and saved by `transformers` (`Qwen3_5ForConditionalGeneration`, names under
    `model.language_model.`, with a vision tower, or `Qwen3_5ForCausalLM`, under `model.`), plus an MTP tensor in a
    shard of its own; returns its parameters by name (float32)."""
    import torch
    import transformers

    torch.manual_seed(int(rng.integers(2**31)))
    if multimodal:
        config = transformers.Qwen3_5Config(text_config=TINY, vision_config=VISION, tie_word_embeddings=tied)
        model = transformers.Qwen3_5ForConditionalGeneration(config)
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**TINY, tie_word_embeddings=tied))
    with torch.no_grad():  # norms and A_log start as zeros and ones: give every parameter random values
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    model.save_pretrained(path)
    save_file({"mtp.fc.weight": np.ones((4, 4), np.float32)}, str(path / "mtp.safetensors"))
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize(("multimodal", "tied"), [(True, True), (True, False), (False, False), (False, True)])
def test_a_transformers_checkpoint_loads_every_tensor(tmp_path, rng, multimodal, tied):
    """Every text-model tensor of a checkpoint `transformers` wrote, under either naming, converted as
    docs/math.md says; the vision tower and MTP tensors are not read; a tied LM head is the embedding array."""
    params = save_transformers_model(tmp_path, rng, multimodal, tied)
    loaded = load_checkpoint(tmp_path, "float32")
    m = loaded.model
    assert (m.vocab_size, m.intermediate_size, m.tie_word_embeddings) == (320, 96, tied)
    model = "model.language_model." if multimodal else "model."
    want = {"embed_tokens": params[f"{model}embed_tokens.weight"], "norm": params[f"{model}norm.weight"]}
    want["lm_head"] = params["lm_head.weight"]
    for i, kind in enumerate(m.layer_types):
        p = f"{model}layers.{i}."
        for name in ("input_layernorm", "post_attention_layernorm"):
            want[f"blocks.{i}.{name}"] = params[f"{p}{name}.weight"]
        for name in ("gate_proj", "up_proj", "down_proj"):
            want[f"blocks.{i}.{name}"] = params[f"{p}mlp.{name}.weight"]
        mixer = p + ("linear_attn." if kind == "gdn" else "self_attn.")
        for name in WEIGHTS[kind](m):
            want[f"layers.{i}.{name}"] = _kernel_layout(name, params, mixer)
    got = loaded.arrays()
    assert sorted(got) == sorted(want)
    for name, value in got.items():
        assert value.dtype == np.float32 and np.allclose(value, want[name], rtol=1e-6, atol=0), name
    assert (loaded.weights["lm_head"] is loaded.weights["embed_tokens"]) == tied


def _kernel_layout(name: str, params: dict, mixer: str) -> np.ndarray:
    """Mixer weight `name` as the kernels take it, from the `transformers` parameters under `mixer`."""
    if name == "A":
        return -np.exp(params[mixer + "A_log"])
    if name == "dt_bias":
        return params[mixer + name]
    w = params[f"{mixer}{name}.weight"]
    return w[:, 0] if name == "conv1d" and w.ndim == 3 else w


@pytest.mark.parametrize("multimodal", [True, False])
def test_a_missing_or_misshaped_model_tensor_is_named(tmp_path, rng, multimodal):
    save_transformers_model(tmp_path, rng, multimodal, tied=False)
    model = "model.language_model." if multimodal else "model."
    files = sorted(tmp_path.glob("model*.safetensors"))
    raw = {}
    for file in files:
        with safe_open(file, "numpy") as h:
            raw |= {k: h.get_tensor(k) for k in h.keys()}
        file.unlink()
    for name, damage in [
        (f"{model}layers.1.mlp.up_proj.weight", None),
        (f"{model}layers.3.post_attention_layernorm.weight", None),
        (f"{model}embed_tokens.weight", None),
        (f"{model}norm.weight", None),
        ("lm_head.weight", None),
        ("lm_head.weight", lambda w: w[:-1]),
        (f"{model}layers.0.mlp.down_proj.weight", lambda w: w.T),
    ]:
        changed = {k: v for k, v in raw.items() if k != name}
        if damage is not None:
            changed[name] = np.ascontiguousarray(damage(raw[name]))
        save_file(changed, str(tmp_path / "model.safetensors"))
        expect = "has shape" if damage is not None else ""
        with pytest.raises(CheckpointError, match=rf"{re.escape(name)}\b.*{expect}|no tensor {re.escape(name)}$"):
            load_checkpoint(tmp_path)
