"""Artifact names: a workload key names exactly what its PrimFunc reads (equal keys, equal functions; a size the
function does not read is not in its key, so no two logs hold one workload), and builds are named by one function."""

from __future__ import annotations

import pytest
import tvm_ffi
from conftest import F32

from gdn_tvm import naming
from gdn_tvm.config import DecodeConfig, ModelConfig
from gdn_tvm.registry import OPS

BASE = DecodeConfig(
    ModelConfig(
        "t", hidden=256, n_layers=4, n_q_heads=4, n_kv_heads=2, n_k_heads=2, n_v_heads=4, head_k_dim=32, head_v_dim=32,
        head_dim=64, intermediate_size=384,
    ),
    batch=2, slots=3, max_len=64, split_len=16, **F32,
)  # fmt: skip
# One field changed at a time: every field of DecodeConfig and ModelConfig, and split counts at one split length.
CHANGES = [
    {"batch": 3}, {"slots": 5}, {"max_len": 128}, {"max_len": 48}, {"max_len": 72}, {"split_len": 32},
    {"hidden": 512}, {"n_q_heads": 8}, {"n_kv_heads": 4}, {"n_k_heads": 4}, {"n_v_heads": 8}, {"head_k_dim": 64},
    {"head_v_dim": 64}, {"head_dim": 128}, {"conv_kernel": 3}, {"partial_rotary_factor": 0.5}, {"rope_theta": 1e6},
    {"rms_norm_eps": 1e-5}, {"l2_norm_eps": 1e-5}, {"head_mapping": "tiled"}, {"n_layers": 8},
    {"full_attention_interval": 2}, {"name": "u"}, {"vocab_size": 1000}, {"intermediate_size": 512},
    {"tie_word_embeddings": True}, {"weight_dtype": "bfloat16"}, {"kv_dtype": "bfloat16"}, {"state_dtype": "bfloat16"},
]  # fmt: skip


@pytest.mark.parametrize("name", list(OPS))
def test_a_workload_key_names_exactly_what_its_primfunc_reads(name):
    op = OPS[name]
    base_key, base_func = op.workload_key(BASE, "cuda"), op.definition(BASE)
    wrong = []
    for change in CHANGES:
        cfg = BASE.replace(**change)
        same_key = op.workload_key(cfg, "cuda") == base_key
        if same_key != tvm_ffi.structural_equal(op.definition(cfg), base_func):
            wrong.append(
                f"{change}: key {'kept' if same_key else 'changed'}, PrimFunc {'changed' if same_key else 'kept'}"
            )
    assert not wrong, f"{name} ({base_key}): " + "; ".join(wrong)


def test_builds_are_named_by_the_same_function():
    assert naming.build(BASE, "llvm") == naming.artifact(
        "llvm", "t", {"batch": 2, "slots": 3, "max_len": 64, "split_len": 16, "head_mapping": "grouped"}
    )
    assert naming.build(BASE, "llvm") == "llvm/t-B2-S3-L64-sl16-grouped"
    assert OPS["gemv_in_proj_z"].workload_key(BASE, "cuda") == "cuda/gemv-f32-B2-N128-K256"


def test_dtypes_are_named_only_where_not_float32():
    """All-float32 names hold no dtype field (the committed logs keep their names); each other dtype is named by its
    field and short name, in builds and in the workloads that read it."""
    bf16 = BASE.replace(weight_dtype="bfloat16", kv_dtype="bfloat16", state_dtype="bfloat16")
    assert naming.build(bf16, "cuda") == "cuda/t-B2-S3-L64-sl16-grouped-wbf16-kvbf16-stbf16"
    assert naming.build(BASE.replace(kv_dtype="bfloat16"), "cuda") == "cuda/t-B2-S3-L64-sl16-grouped-kvbf16"
    assert OPS["gemv_in_proj_z"].workload_key(bf16, "cuda") == "cuda/gemv-f32-B2-N128-K256-wbf16"
    assert OPS["kv_row_scatter"].workload_key(bf16, "cuda") == "cuda/kv_row_scatter-f32-B2-S3-L64-Hkv2-D64-kvbf16"
    assert OPS["sigmoid_gate"].workload_key(bf16, "cuda") == OPS["sigmoid_gate"].workload_key(BASE, "cuda")


@pytest.mark.parametrize("field", ["weight_dtype", "kv_dtype", "state_dtype"])
def test_a_dtype_outside_the_table_is_refused_by_field_name(field):
    with pytest.raises(ValueError, match=f"{field} must be one of"):
        BASE.replace(**{field: "float16"})


def test_arrays_the_kernels_index_with_int32_are_held_under_2_31_elements():
    """The recurrent and conv state pools (by slots) and the logits (by lanes) index with int32: a config that would
    pass 2**31 elements in one is refused naming the field; the largest that fits is taken."""
    m = BASE.model
    per_slot = m.n_v_heads * m.head_v_dim * m.head_k_dim
    BASE.replace(slots=(2**31 - 1) // per_slot)
    with pytest.raises(ValueError, match=r"slots=\d+: the recurrent state pool would hold"):
        BASE.replace(slots=(2**31 - 1) // per_slot + 1)
    small = BASE.replace(n_k_heads=1, n_v_heads=1, head_v_dim=2, conv_kernel=2)  # the conv pool the larger
    conv = small.model.conv_dim * (small.model.conv_kernel - 1)
    with pytest.raises(ValueError, match=r"slots=\d+: the conv state pool would hold"):
        small.replace(slots=(2**31 - 1) // conv + 1)
    lanes = (2**31 - 1) // m.vocab_size + 1
    with pytest.raises(ValueError, match=rf"batch={lanes}: the logits would hold"):
        small.replace(batch=lanes, slots=lanes)


@pytest.mark.parametrize(
    "change",
    [
        {"partial_rotary_factor": 3 / 64},  # 3 dims: RoPE rotates pairs
        {"partial_rotary_factor": 1 / 128},  # no dims
        {"rope_theta": 1e39},  # past float32: the kernels hold it as a float32 literal
        {"rms_norm_eps": 1e-45},  # a float32 subnormal, flushed to zero on the GPU
        {"l2_norm_eps": 0.0},
    ],
    ids=str,
)
def test_a_model_the_kernels_cannot_hold_is_refused_by_field_name(change):
    (field,) = change
    with pytest.raises(ValueError, match=field):
        BASE.replace(**change)
