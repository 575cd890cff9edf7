"""Compile-only CUDA: every op's hand schedule lowers, generates CUDA source and (with nvcc) PTX for sm_90; the
dlight baseline builds device code or is refused."""

from __future__ import annotations

import shutil

import pytest
import tvm
from conftest import cuda_source
from tvm.support import nvcc

from gdn_tvm.build.compile import compile_dlight, dlight_schedule, host_loops
from gdn_tvm.config import PRESETS, DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.target import cuda

CUDA_CASES = {
    "4b-B1": DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=32768),
    "0.8b-B32": DecodeConfig(preset("qwen3.5-0.8b"), batch=32, slots=64, max_len=4096),
}


@pytest.mark.parametrize("case", CUDA_CASES)
@pytest.mark.parametrize("name", OPS)
def test_cuda_codegen(name, case):
    src = cuda_source(name, CUDA_CASES[case])
    assert "__global__" in src


@pytest.mark.parametrize("model", PRESETS)
def test_every_preset_lowers_every_op(model):
    """`make build --preset P` for CUDA: every op's hand schedule lowers at the preset's default decode shape
    (qwen3.5-27b's unsplit attention did not: its merge held barriers inside a condition)."""
    cfg = DecodeConfig(preset(model))
    for name in OPS:
        assert "__global__" in cuda_source(name, cfg), name


@pytest.mark.parametrize("positions", [2, 4])
def test_split_kv_lowers_with_sixteen_warps(positions):
    """The knob grid's largest CTA (512 threads, for B=1, where more warps in flight kept helping on the H200)
    lowers; with nvcc, it compiles and fits sm_90's 48 KiB of static shared memory."""
    src = cuda_source("decode_attention_split", CUDA_CASES["4b-B1"], warps=16, positions=positions)
    assert "__launch_bounds__(512)" in src
    if shutil.which("nvcc"):
        with cuda():
            nvcc.compile_cuda(src, target_format="cubin", compiler="nvcc")


@pytest.mark.parametrize("heads_per_block", [0, 4])
def test_rope_shared_angles_are_computed_once_per_block(heads_per_block):
    """With `shared_angles` the first warp alone evaluates the float64 angles, into shared memory, and one barrier
    orders them before the rotations (0 heads per block: all 20 heads of a qwen3.5-4b lane in one block)."""
    cfg = CUDA_CASES["4b-B1"]
    src = cuda_source("partial_neox_rope_indirect", cfg, heads_per_block=heads_per_block, shared_angles=True)
    threads = 32 * (heads_per_block or cfg.model.n_q_heads + cfg.model.n_kv_heads)
    assert f"__launch_bounds__({threads})" in src and "cos_shared" in src
    assert src.count("__syncthreads()") == 1 and "threadIdx.y) < 1)" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", OPS)
def test_cuda_ptx_sm90(name):
    src = cuda_source(name, CUDA_CASES["4b-B1"])
    with cuda():
        ptx = nvcc.compile_cuda(src, target_format="ptx", compiler="nvcc")
    assert b".target sm_90" in ptx


@pytest.mark.parametrize("name", list(OPS))
def test_hand_schedule_leaves_no_loop_on_the_host(name):
    cfg = CUDA_CASES["0.8b-B32"]
    assert host_loops(OPS[name].schedule(cfg, "cuda").mod["main"].body) == []


def test_dlight_refuses_loops_left_on_the_host():
    """dlight's fallback schedules the split-KV reduce's nested blocks one by one and leaves the (lane, head) loops
    around them serial; they read positions from device memory, so on the host they segfaulted the H200 op
    benchmark."""
    with pytest.raises(ValueError, match="leaves loops b on the host"):
        dlight_schedule(OPS["decode_attention_reduce"], CUDA_CASES["0.8b-B32"], cuda())


@pytest.mark.parametrize("name", list(OPS))
def test_dlight_builds_device_code_or_is_refused(name):
    """dlight leaves what no rule fits unscheduled, which TVM compiles for the host; such a kernel segfaulted the
    H200 benchmark when called on device memory. `compile_dlight` must refuse it instead."""
    try:
        kernel = compile_dlight(OPS[name], CUDA_CASES["0.8b-B32"], cuda())
    except (ValueError, tvm.s_tir.ScheduleError) as err:
        assert name.startswith(("decode_attention", "partial_neox_rope")), f"dlight refused {name}: {err}"
        return
    assert kernel.device[0] == tvm.cuda().dlpack_device_type()
