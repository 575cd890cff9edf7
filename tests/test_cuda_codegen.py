"""Compile-only CUDA: every op's hand schedule lowers, generates CUDA source and (with nvcc) PTX for sm_90; the
dlight baseline builds device code or is refused."""

from __future__ import annotations

import re
import shutil

import pytest
import tvm
from conftest import CASES, CUDA_OPS, F32, cuda_source
from tvm.script import tirx as T
from tvm.support import nvcc

from gdn_tvm.codegen import compile as compile_module
from gdn_tvm.codegen.compile import compile_dlight, compile_mod, host_loops, is_in_place, writes_state_pool
from gdn_tvm.config import PRESETS, DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.target import cuda

CUDA_CASES = {
    "4b-B1": DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=32768, **F32),
    "0.8b-B32": DecodeConfig(preset("qwen3.5-0.8b"), batch=32, slots=64, max_len=4096, **F32),
}


@pytest.mark.parametrize("case", CUDA_CASES)
@pytest.mark.parametrize("name", CUDA_OPS)
def test_cuda_codegen(name, case):
    src = cuda_source(name, CUDA_CASES[case])
    assert "__global__" in src


@pytest.mark.parametrize("model", PRESETS)
def test_every_preset_lowers_every_op(model):
    """`make build --preset P` for CUDA: every op the preset has (`Op.applies`) lowers at its default decode shape
    (qwen3.5-27b's unsplit attention did not: its merge held barriers inside a condition)."""
    cfg = DecodeConfig(preset(model), **F32)
    for name in (n for n, op in CUDA_OPS.items() if op.applies(cfg)):
        assert "__global__" in cuda_source(name, cfg), name


@pytest.mark.parametrize(("positions", "lanes"), [(2, 32), (4, 8)])
def test_split_kv_lowers_with_sixteen_warps(positions, lanes):
    """The knob grid's largest CTA (512 threads, for B=1, where more warps in flight kept helping on the H200)
    lowers; with nvcc, it compiles and fits sm_90's 48 KiB of static shared memory."""
    src = cuda_source("decode_attention_split", CUDA_CASES["4b-B1"], warps=16, positions=positions, lanes=lanes)
    assert "__launch_bounds__(512)" in src
    if shutil.which("nvcc"):
        with cuda():
            nvcc.compile_cuda(src, target_format="cubin", compiler="nvcc")


# The score allreduce is the kernel's first: its tree of `__shfl_down_sync` offsets (width 32 as TVM emits it).
SCORE_SHUFFLES = re.compile(r"__shfl_down_sync\(mask_ptr\[0\], red_buf0_ptr\[0\], (\d+), 32\)")
# A float4 of K at element `i*32 + 4*threadIdx.x` of the row: the 8 lanes of a row read 128 contiguous bytes.
K_ROW_LOAD = re.compile(
    re.escape("*(float4*)(k_cache_ptr + ")
    + r".*"
    + re.escape(" * (int64_t)32)) + (((int64_t)((int)threadIdx.x)) * (int64_t)4)));")
)


@pytest.mark.parametrize(
    "cfg",
    [CASES["4b-B3"], DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=4096, **F32)],
    ids=["4b-B3", "4b-B1-4096"],
)
def test_split_kv_scores_on_eight_lanes(cfg):
    """lanes=8: a row of 8 lanes scores a position over D (8 float4 a lane, 128 contiguous bytes a load), its sum a
    3-level shuffle tree among those lanes, read back from the row's first lane; it compiles with nvcc. The unsplit
    stage rejects the knob."""
    src = cuda_source("decode_attention_split", cfg, lanes=8)
    assert SCORE_SHUFFLES.findall(src) == ["4", "2", "1"]
    assert "__shfl_sync(mask_ptr[0], red_buf0_ptr[0], (((int)threadIdx.y) * 8), 32)" in src
    assert K_ROW_LOAD.search(src)
    if shutil.which("nvcc"):
        with cuda():
            nvcc.compile_cuda(src, target_format="cubin", compiler="nvcc")
    with pytest.raises(ValueError, match="unsplit: lanes=8"):
        OPS["decode_attention"].schedule(cfg, "cuda", lanes=8)


@pytest.mark.parametrize("heads_per_block", [0, 4])
def test_rope_shared_angles_are_computed_once_per_block(heads_per_block):
    """With `shared_angles` the first warp alone evaluates the float64 angles, into shared memory, and one barrier
    orders them before the rotations (0 heads per block: all 20 heads of a qwen3.5-4b lane in one block)."""
    cfg = CUDA_CASES["4b-B1"]
    src = cuda_source("partial_neox_rope", cfg, heads_per_block=heads_per_block, shared_angles=True)
    threads = 32 * (heads_per_block or cfg.model.n_q_heads + cfg.model.n_kv_heads)
    assert f"__launch_bounds__({threads})" in src and "cos_shared" in src
    assert src.count("__syncthreads()") == 1 and "threadIdx.y) < 1)" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("name", CUDA_OPS)
def test_cuda_ptx_sm90(name):
    src = cuda_source(name, CUDA_CASES["4b-B1"])
    with cuda():
        ptx = nvcc.compile_cuda(src, target_format="ptx", compiler="nvcc")
    assert b".target sm_90" in ptx


@pytest.mark.parametrize("name", list(CUDA_OPS))
def test_hand_schedule_leaves_no_loop_on_the_host(name):
    cfg = CUDA_CASES["0.8b-B32"]
    assert host_loops(OPS[name].schedule(cfg, "cuda").mod["main"].body) == []


def test_host_loops_finds_loops_no_thread_binds():
    """dlight's fallback once scheduled the split-KV reduce's nested blocks one by one and left the (lane, head)
    loops around them serial; they read positions from device memory, so on the host they segfaulted the H200 op
    benchmark. `dlight_schedule` refuses a function where `host_loops` finds any."""

    @T.prim_func(s_tir=True)
    def half_bound(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
        for b in range(4):
            for t in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("copy"):
                    vb, vt = T.axis.remap("SS", [b, t])
                    y[vb, vt] = x[vb, vt]

    @T.prim_func(s_tir=True)
    def bound(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
        for b in T.thread_binding(4, thread="blockIdx.x"):
            for t in T.thread_binding(32, thread="threadIdx.x"):
                with T.sblock("copy"):
                    vb, vt = T.axis.remap("SS", [b, t])
                    y[vb, vt] = x[vb, vt]

    @T.prim_func(s_tir=True)
    def chain(x: T.Buffer((4, 32), "float32"), y: T.Buffer((4, 32), "float32")):
        for n in range(3):  # three launches, one an iteration (as `sample` chains its search steps)
            for b in T.thread_binding(4, thread="blockIdx.x"):
                for t in T.thread_binding(32, thread="threadIdx.x"):
                    with T.sblock("scale"):
                        vn, vb, vt = T.axis.remap("SSS", [n, b, t])
                        y[vb, vt] = x[vb, vt] * T.Cast("float32", vn)

    assert host_loops(half_bound.body) == ["b"] and host_loops(bound.body) == [] and host_loops(chain.body) == []


@pytest.mark.parametrize("name", list(CUDA_OPS))
def test_dlight_builds_device_code_or_is_refused(name):
    """dlight leaves what no rule fits unscheduled, which TVM compiles for the host; such a kernel segfaulted the
    H200 benchmark when called on device memory. `compile_dlight` must refuse it instead."""
    refused = (
        "decode_attention",
        "partial_neox_rope",
        "attention_prologue",
        "gemv_out_proj_norm_residual",
        "sample",
        "argmax",
        "split_bf16",
    )
    try:
        kernel = compile_dlight(OPS[name], CUDA_CASES["0.8b-B32"], cuda())
    except (ValueError, tvm.s_tir.ScheduleError) as err:
        assert name.startswith(refused), f"dlight refused {name}: {err}"
        return
    assert kernel.device[0] == tvm.cuda().dlpack_device_type()


def test_dlight_schedules_the_swiglu_gemv_at_one_lane():
    """dlight's GEMV rule takes the SwiGLU GEMV at B = 1 too: its epilogue reads the `[2, B, I]` scratch as a product
    over the pair (its rule once failed an assertion on the interleaved `2n + j` rows)."""
    kernel = compile_dlight(OPS["gemv_gate_up_proj_swiglu"], CUDA_CASES["4b-B1"], cuda())
    assert kernel.device[0] == tvm.cuda().dlpack_device_type()


# A float4 of V read unconditionally at row `min(t, n - 1)` of the chunk (the last valid row past the sequence).
V_ROW_LOAD = re.compile(r"= \*\(float4\*\)\(v_cache_ptr \+ .*min\(")
# The loop over a chunk's K row steps (the first `t_0` loop) or V row steps (the last), with its unroll pragma.
ROW_STEPS = re.compile(r"(#pragma unroll\n\s*)?for \(int t_0(?:_\d+)? = 0; t_0(?:_\d+)? < (\d+);")


def test_split_kv_chunk_loads_issue_together():
    """qwen3.5-4b B=1 over 4096 rows: the split's chunk is a fixed 128 rows, its 2 K and 4 V row steps unrolled, and
    no V load sits under a branch (one did, and each waited for the one before). B=32's 2-warp CTAs take 16 K and 32
    V steps: left rolled (unrolled, they ran out of registers)."""
    b1 = cuda_source("decode_attention_split", DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=4096, **F32))
    steps = ROW_STEPS.findall(b1)
    assert (steps[0], steps[-1]) == (("#pragma unroll\n    ", "2"), ("#pragma unroll\n    ", "4"))
    lines = b1.splitlines()
    loads = [i for i, line in enumerate(lines) if V_ROW_LOAD.search(line)]
    assert loads and not any("condval" in line for i in loads for line in lines[i - 3 : i + 1])
    b32 = cuda_source("decode_attention_split", DecodeConfig(preset("qwen3.5-4b"), batch=32, max_len=4096, **F32))
    steps = ROW_STEPS.findall(b32)
    assert (steps[0], steps[-1]) == (("", "16"), ("", "32"))


# The ops writing a slot pool's state in place (conv windows, the recurrent state): at qwen3.5-0.8b B=1.
STATE_POOL_WRITERS = {
    "causal_conv1d_silu", "delta_rule", "delta_rule_fused",
    "gemv_in_proj_conv", "gemv_in_proj_qkv_conv", "gemv_in_proj_rmsnorm_conv",
}  # fmt: skip


def test_state_pool_writers_are_the_conv_and_recurrent_states():
    """Of the in-place ops, those writing a slot pool (read again next step) and not the residual or the lane
    counters (read again within the step)."""
    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=64, **F32)
    in_place = {
        name: writes_state_pool(mod)
        for name, op in OPS.items()
        if op.applies(cfg) and op.compiled("cuda") and is_in_place(mod := tvm.IRModule({"main": op.definition(cfg)}))
    }
    assert {name for name, pool in in_place.items() if pool} == STATE_POOL_WRITERS
    assert {"add_rmsnorm", "advance", "gemv_down_proj_residual"} <= in_place.keys()


class _Compiled(Exception):
    """Raised by the stand-in for `tvm.compile`: what the CUDA compile callback would have seen is recorded."""


@pytest.mark.parametrize("name", ["delta_rule", "add_rmsnorm"])
def test_state_pool_stores_stream_for_cuda_only(name, monkeypatch):
    """The ptxas flags TVM's compile callback reads during `compile_mod`: evict-first stores for a state pool's CUDA
    kernel, added to the caller's own flags and taken back after; nothing for other kernels or for llvm."""
    seen = []

    def record(*_args, **_kwargs):
        seen.append(nvcc._ptxas_option_flags())
        raise _Compiled

    monkeypatch.setattr(tvm, "compile", record)
    monkeypatch.setenv(compile_module.PTXAS_ENV, "-O3")
    cfg = CUDA_CASES["4b-B1"]
    mod = tvm.IRModule({"main": OPS[name].definition(cfg)})
    for target in (cuda(), tvm.target.Target("llvm")):
        with pytest.raises(_Compiled):
            compile_mod(mod, target)
    streams = name in STATE_POOL_WRITERS
    assert [compile_module.STREAMING_STORES[0] in flags for flags in seen] == [streams, False]
    assert all("-O3" in flags for flags in seen)
    assert nvcc._ptxas_option_flags()[-1] == "-O3"
