"""Batched bf16 GEMVs on tensor cores (`schedules/mma.py`, `schedules/gemv.py`): when the default takes them, the
generated CUDA (`mma.sync` bf16, `ldmatrix`, fragments in registers), its numerics on the CPU emulator against the
float64 reference (x split into bf16 hi + lo keeps float32 accuracy), and the layout rules."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import check_kernel_against_reference
from cuda_emu import emulated, lower
from gdn_tvm.schedules.gemv import tensor_core_layout, uses_tensor_cores
from tvm.support import nvcc

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.target import cuda, gpu_present
from gdn_tvm.verify import check_kernel

SWIGLU = "gemv_gate_up_proj_swiglu"


TC = {"tensor_cores": True}
BIG_CTA = {"dynamic_smem": True, "m_frags": 4, "warps_n": 4, "n_frags": 2}  # 8 warps: 128 lanes x 128 rows a CTA


def _cfg(batch: int, weight_dtype: str = "bfloat16", model: str = "qwen3.5-0.8b") -> DecodeConfig:
    return DecodeConfig(preset(model), batch=batch, weight_dtype=weight_dtype)


@pytest.mark.parametrize(
    "proj, batch, dtype, conv, norm, expected",
    [
        ("in_proj_qkv", 128, "bfloat16", False, False, True),
        ("down_proj", 256, "bfloat16", False, False, True),
        ("lm_head", 16, "bfloat16", False, False, True),  # 248,320 rows: from 16 lanes
        ("in_proj_qkv", 32, "bfloat16", False, False, False),  # CUDA cores measured faster at B = 32
        ("in_proj_qkv", 128, "float32", False, False, False),  # float32 weights: CUDA cores
        ("lm_head", 8, "bfloat16", False, False, False),  # fewer than 16 lanes
        ("lm_head", 24, "bfloat16", False, False, False),  # not whole 16-lane tiles
        ("in_proj_qkv", 128, "bfloat16", True, False, False),  # the conv epilogue
        ("out_proj", 128, "bfloat16", False, True, False),  # the norm prologue
    ],
)
def test_tensor_cores_are_the_default_for_bf16_lanes_in_16s(proj, batch, dtype, conv, norm, expected):
    assert uses_tensor_cores(_cfg(batch, dtype), proj, conv, norm) == expected


@pytest.mark.parametrize("stages", [1, 2])
@pytest.mark.parametrize("name", ["gemv_in_proj_qkv", SWIGLU])
def test_tensor_core_source_uses_mma_ldmatrix_and_register_fragments(name, stages):
    """One launch; bf16 `mma.sync` and `ldmatrix` in it; every warp buffer lowered to per-thread registers (8
    elements a 16 x 16 tile, not the 32-lane tile); x and w staged with 16-byte loads, or with 2 stages 16-byte
    `cp.async` copies into two buffers, waiting for all but the newest group; nvcc builds it for sm_90."""
    cfg = _cfg(32)
    b_tiles, warps_m, m_frags, warps_n, n_frags, *_ = tensor_core_layout(
        cfg, name[5:].removesuffix("_swiglu"), "swiglu" in name, stages=stages
    )
    source, launches = lower(OPS[name].schedule(cfg, "cuda", **TC, stages=stages).mod)
    assert len(launches) == 1 and launches[0].block == (32, warps_m * warps_n, 1)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in source
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in source
    fragments = dict(re.findall(r"alignas\(64\) (?:float|nv_bfloat16) (\w+_warp_ptr)\[(\d+)\];", source))
    assert fragments == {
        "x_shared_warp_ptr": str(8 * m_frags),
        "w_shared_warp_ptr": str(8 * n_frags),
        ("gate_up_warp_ptr" if name == SWIGLU else "y_warp_ptr"): str(8 * m_frags * n_frags),
    }
    if stages == 1:
        assert re.search(r"\*\(uint4\*\)\(w_ptr \+", source) and re.search(r"\*\(float4\*\)\(x_ptr \+", source)
        assert "cp.async" not in source
    else:
        assert re.search(r"ptx_cp_async_legacy_cg_16_2_2\(w_shared_ptr, .*w_ptr", source)
        assert re.search(r"ptx_cp_async_legacy_cg_16_4_4\(x_shared_ptr, .*x_ptr", source)
        assert "cp.async.wait_group 1;" in source
    if shutil.which("nvcc"):
        with cuda():
            assert b".target sm_90" in nvcc.compile_cuda(source, target_format="ptx", compiler="nvcc")


EMULATED = {  # (op, batch, knobs): the default layouts, several k steps and B tiles, warps over B and N, 1-3 stages
    "qkv-B16": ("gemv_in_proj_qkv", 16, TC),
    "down-B32-4-lane-tiles": ("gemv_down_proj", 32, TC | {"m_frags": 2, "stages": 1}),
    "z-B64-warps": ("gemv_in_proj_z", 64, TC | {"warps_n": 2, "n_frags": 2, "m_frags": 1, "k_tiles": 2, "stages": 3}),
    "swiglu-B32": (SWIGLU, 32, TC),
    "swiglu-B48-warps": (SWIGLU, 48, TC | {"warps_n": 2, "n_frags": 1, "m_frags": 1}),
    "z-B128-dynamic-104KB": ("gemv_in_proj_z", 128, TC | BIG_CTA),  # every lane and 128 rows a CTA
    "swiglu-B64-dynamic-60KB": (SWIGLU, 64, TC | {"dynamic_smem": True, "m_frags": 4, "warps_n": 2, "n_frags": 1}),
    "z-B256-wide-default": ("gemv_in_proj_z", 256, {}),  # 2 B tiles of 128 lanes x 32 rows, 8 warps along the lanes
}


@pytest.mark.parametrize("case", EMULATED)
def test_tensor_core_kernel_matches_reference(case, rng):
    """The emulated kernel within the bf16 tolerance of the float64 reference on float32 activations (the hi + lo
    split keeps ~1e-5; rounding x to bf16 alone would not pass)."""
    name, batch, knobs = EMULATED[case]
    op, cfg = OPS[name], _cfg(batch)
    kernel = emulated(op, cfg, *lower(op.schedule(cfg, "cuda", **knobs).mod))
    check_kernel_against_reference(op, cfg, kernel, rng)


def test_pipelined_kernel_that_waits_too_little_fails_the_check(rng):
    """The 2-stage kernel with its wait for the older copies made a wait for none: the warps multiply chunks still in
    flight (stale shared memory, in the emulator as on a GPU)."""
    op, cfg = OPS["gemv_in_proj_qkv"], _cfg(16)
    source, launches = lower(op.schedule(cfg, "cuda", **TC, stages=2).mod)
    broken = source.replace("cp.async.wait_group 1;", "cp.async.wait_group 2;")
    assert broken != source
    failed = check_kernel(op, cfg, emulated(op, cfg, broken, launches), rng)
    assert len(failed) == 1 and "relative L-inf error" in failed[0], failed


@pytest.mark.parametrize(
    "batch, dtype, knobs, message",
    [
        (32, "float32", {}, "bf16 weights"),
        (24, "bfloat16", {}, "lanes in 16s"),
        (32, "bfloat16", {"m_frags": 4}, "do not divide"),  # 2 m tiles
        (32, "bfloat16", {"warps_n": 4, "n_frags": 4, "k_tiles": 3}, "do not divide"),
        (256, "bfloat16", {"warps_n": 4, "n_frags": 2, "m_frags": 4, "stages": 3}, "3 stages fits"),
        (64, "bfloat16", BIG_CTA | {"stages": 7}, "7 stages fits 232448 bytes"),  # 7 x 35 KB: past 227 KB
        (16, "bfloat16", {"dynamic_smem": True}, "fit static shared memory"),  # the same kernel as without
    ],
)
def test_tensor_core_layout_refuses_what_it_cannot_tile(batch, dtype, knobs, message):
    with pytest.raises(ValueError, match=message):
        tensor_core_layout(_cfg(batch, dtype), "in_proj_qkv", **knobs)


def test_tensor_core_layout_fills_the_gpu_and_shared_memory():
    """Static defaults: the most rows a CTA that leave a CTA for every SM, then the fewest B tiles whose chunks fit
    shared memory; 1 lane tile a warp and 2 stages, 4 lane tiles and 1 stage on the LM head. Wide defaults in dynamic
    shared memory, the layouts the H200 timed fastest: warps along the lanes (8 over 128), 4 row tiles a warp where
    that leaves half the SMs a CTA, else 2; on the LM head every lane (up to 256) and 128 rows."""
    cfg = _cfg(128, model="qwen3.5-4b")
    lane_warps = {"m_frags": 1, "warps_n": 1, "dynamic_smem": True}
    assert tensor_core_layout(cfg, "in_proj_qkv") == (1, 8, 1, 1, 4, 4, 2)  # 128 CTAs
    assert tensor_core_layout(cfg, "in_proj_qkv") == tensor_core_layout(cfg, "in_proj_qkv", n_frags=4, **lane_warps)
    assert tensor_core_layout(cfg, "down_proj") == (1, 8, 1, 1, 2, 4, 2)  # 4 row tiles would leave 40 CTAs
    assert tensor_core_layout(cfg, "gate_up_proj", swiglu=True) == (1, 8, 1, 1, 4, 4, 2)
    assert tensor_core_layout(cfg, "lm_head") == (1, 2, 4, 2, 4, 4, 1)
    assert tensor_core_layout(cfg, "in_proj_qkv", dynamic_smem=False) == (2, 4, 1, 2, 1, 4, 2)  # static
    assert tensor_core_layout(cfg, "gate_up_proj", swiglu=True, dynamic_smem=False) == (8, 1, 1, 4, 1, 4, 2)
    assert tensor_core_layout(cfg, "down_proj", dynamic_smem=False) == (2, 4, 1, 1, 1, 4, 2)  # 320 CTAs
    assert tensor_core_layout(cfg, "down_proj", stages=1, dynamic_smem=False) == (1, 8, 1, 1, 1, 4, 1)
    assert tensor_core_layout(_cfg(32, model="qwen3.5-4b"), "lm_head") == (1, 1, 2, 4, 2, 4, 1)  # static
    cfg = _cfg(256, model="qwen3.5-4b")
    for proj, swiglu in (("in_proj_qkv", False), ("down_proj", False), ("out_proj", False), ("gate_up_proj", True)):
        assert tensor_core_layout(cfg, proj, swiglu) == (2, 8, 1, 1, 4, 4, 2)
    assert tensor_core_layout(cfg, "lm_head") == (1, 4, 4, 2, 4, 4, 1)


@pytest.mark.parametrize(
    "model, batch, name, dynamic",
    [
        ("qwen3.5-4b", 128, "gemv_in_proj_qkv", 2 * (128 * (64 + 4) * 4 + 64 * (64 + 8) * 2)),
        ("qwen3.5-4b", 128, "gemv_down_proj", 2 * (128 * 68 * 4 + 32 * 72 * 2)),
        ("qwen3.5-4b", 256, SWIGLU, 2 * (128 * 68 * 4 + 64 * 72 * 2) + 2 * 128 * 64 * 4),
        ("qwen3.5-4b", 256, "gemv_lm_head", 256 * 68 * 4 + 128 * 72 * 2),
        ("qwen3.5-4b", 32, "gemv_lm_head", 0),  # the static layout
    ],
)
def test_wide_defaults_stage_in_dynamic_shared_memory(model, batch, name, dynamic):
    """A default wide layout builds with its chunks in one dynamic allocation of the size its launch asks for."""
    cfg = _cfg(batch, model=model)
    source, launches = lower(OPS[name].schedule(cfg, "cuda").mod)
    assert [launch.dynamic_shared for launch in launches][:1] == [dynamic]
    assert ("extern __shared__" in source) == bool(dynamic)


def test_dynamic_shared_memory_holds_every_lane_in_one_cta():
    """128 lanes x 128 rows a CTA in two stages take 104 KB: no B tiling of them fits the 48 KB a CTA may hold
    statically; in dynamic shared memory (up to the H200's 227 KB) one CTA holds every lane, so each weight byte is
    read once."""
    cfg = _cfg(128, model="qwen3.5-4b")
    with pytest.raises(ValueError, match="fits 49152 bytes"):
        tensor_core_layout(cfg, "in_proj_qkv", warps_n=4, n_frags=2, m_frags=4)
    assert tensor_core_layout(cfg, "in_proj_qkv", **BIG_CTA) == (1, 2, 4, 4, 2, 4, 2)
    source, launches = lower(OPS["gemv_in_proj_qkv"].schedule(cfg, "cuda", **TC, **BIG_CTA).mod)
    assert "extern __shared__" in source and "__shared__ alignas" not in source
    assert [launch.dynamic_shared for launch in launches] == [2 * (128 * (64 + 4) * 4 + 128 * (64 + 8) * 2)]


def test_split_keeps_float32_accuracy(rng):
    """The hi + lo split the x fragments take, in numpy: |x - hi - lo| <= 2^-16 |x| (16 significand bits), where
    bf16 alone is off by up to 2^-9."""
    x = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-8, 8, 100_000)).astype(np.float32)

    def bf16(v: np.ndarray) -> np.ndarray:
        u = v.view(np.uint32)
        return ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(np.float32)

    hi = bf16(x)
    lo = bf16(x - hi)
    assert np.all(np.abs(x.astype(np.float64) - hi - lo) <= 2.0**-16 * np.abs(x))
    assert np.max(np.abs(x - hi) / np.abs(x)) > 2.0**-10


GPU_CASES = [(name, batch) for name in ("gemv_in_proj_qkv", "gemv_down_proj", SWIGLU) for batch in (16, 32, 128, 256)]
GPU_CASES += [("gemv_lm_head", 32)]  # its float64 reference is the slow part
GPU_CASES += [("gemv_in_proj_qkv", 128, BIG_CTA)]  # past 48 KB: the runtime opts the kernel in
GPU_CASES += [("gemv_lm_head", 128)]  # its wide default: 128 lanes x 128 rows a CTA


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU")
@pytest.mark.parametrize("model", ["qwen3.5-0.8b", "qwen3.5-4b"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(str(v) for v in c[:2]) + ("-big" if c[2:] else ""))
def test_tensor_core_gemv_on_gpu(case, model, rng):
    name, batch, *knobs = case
    op, cfg = OPS[name], _cfg(batch, model=model)
    check_kernel_against_reference(op, cfg, compile_op(op, cfg, cuda(), **TC, **(knobs[0] if knobs else {})), rng)
