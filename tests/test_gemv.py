"""gemv: schedule knobs off the defaults (predicated B tiles, several smem chunks, one row per CTA) against the
reference, the CUDA design in the generated source (float4 weight loads, x in shared memory, shuffles), the SwiGLU
variant's one kernel, and the LM head's vocabulary of rows."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import F32, check_kernel_against_reference, cuda_source
from cuda_emu import lower
from gdn_tvm.schedules.gemv import SMALL_LANES, SMALL_WEIGHTS, cuda_layout
from tvm.support import nvcc

from gdn_tvm import plan
from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import PRESETS, DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.target import cuda, gpu_present, llvm

KNOBS = {  # (proj, batch, cuda knobs, x staged in shared memory)
    "rows1-B1": ("in_proj_b", 1, {}, False),
    "rows4-chunks": ("out_proj", 3, {"rows": 4, "threads_per_row": 64, "smem_bytes": 4096}, True),
    "B17-predicated": ("in_proj_z", 17, {"batch_tile": 6, "unroll": 2}, True),
    "B40-rows1": ("in_proj_a", 40, {"threads_per_row": 128, "batch_tile": 16, "rows_per_thread": 1}, False),
    "B32-4-rows-a-thread": ("in_proj_qkv", 32, {}, True),
    "B9-2-rows-a-thread": ("out_proj", 9, {"rows": 4, "rows_per_thread": 2, "batch_tile": 4}, True),
}


def _cfg(batch: int, model: str = "qwen3.5-0.8b") -> DecodeConfig:
    return DecodeConfig(preset(model), batch=batch, **F32)


def _check(name: str, cfg: DecodeConfig, target, rng, **knobs) -> None:
    op = OPS[name]
    check_kernel_against_reference(op, cfg, compile_op(op, cfg, target, **knobs), rng)


@pytest.mark.parametrize("batch", [5, 17])
@pytest.mark.parametrize("name", ["gemv_in_proj_b", "gemv_out_proj", "gemv_gate_up_proj_swiglu"])
def test_llvm_batch_tiles(name, batch, rng):
    _check(name, _cfg(batch), llvm(), rng, batch_tile=3)


@pytest.mark.parametrize("case", KNOBS)
def test_cuda_knobs_codegen(case):
    proj, batch, knobs, staged = KNOBS[case]
    src = cuda_source(f"gemv_{proj}", _cfg(batch), **knobs)
    assert re.search(r"\*\(float4\*\)\(w_ptr \+", src), "w is not read with float4 loads"
    assert "__shfl_down_sync" in src
    assert bool(re.search(r"__shared__ alignas\(64\) float4? x_shared", src)) == staged
    if shutil.which("nvcc"):
        with cuda():
            assert b".target sm_90" in nvcc.compile_cuda(src, target_format="ptx", compiler="nvcc")


@pytest.mark.parametrize("case", KNOBS)
def test_bf16_weights_load_16_bytes_and_compute_in_float4s(case):
    """bf16 weights: 8 a load (`uint4`), widened in registers; x still moves in float4s (TVM prints float32x8
    arithmetic as a `make_ulonglong4` of 8 floats, which nvcc rejects)."""
    proj, batch, knobs, _ = KNOBS[case]
    src = cuda_source(f"gemv_{proj}", _cfg(batch).replace(weight_dtype="bfloat16"), **knobs)
    assert re.search(r"\*\(uint4\*\)\(w_ptr \+", src), "w is not read with 16-byte loads"
    assert "make_ulonglong4" not in src and "ulonglong4" not in src


SWIGLU = "gemv_gate_up_proj_swiglu"
SWIGLU_KNOBS = {  # (batch, cuda knobs): rows count gate/up pairs
    "B1": (1, {}),
    "B1-rows1": (1, {"rows": 1, "threads_per_row": 128}),
    "B3-chunks": (3, {"rows": 4, "threads_per_row": 64, "smem_bytes": 4096}),
    "B17-predicated": (17, {"batch_tile": 6, "rows_per_thread": 2, "rows": 4}),
    "B32": (32, {"tensor_cores": False}),  # the CUDA-core design (tensor cores: test_gemv_tensor_cores)
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", SWIGLU_KNOBS)
def test_swiglu_is_one_kernel_reading_gate_and_up_rows_16_bytes_a_load(case, dtype):
    """One launch whose only global arguments are w, x and y (the gate and up sums meet in shared memory, where TVM
    may reuse x's stage for them); a thread
    loads its gate row and its up row `I * K` elements further with 16-byte loads (float4, or 8 bf16 as a uint4)."""
    batch, knobs = SWIGLU_KNOBS[case]
    cfg = _cfg(batch).replace(weight_dtype=dtype)
    source, launches = lower(OPS[SWIGLU].schedule(cfg, "cuda", **knobs).mod)
    assert len(launches) == 1
    params = re.search(r"main_kernel\(([^)]*)\) \{", source)
    assert params and [p.split()[-1] for p in params.group(1).split(",")] == ["w_ptr", "x_ptr", "y_ptr"]
    assert "__shfl_down_sync" in source
    vector = "uint4" if dtype == "bfloat16" else "float4"
    assert re.search(rf"\*\({vector}\*\)\(w_ptr \+", source), f"w is not read with {vector} loads"
    assert f"* {cfg.model.intermediate_size * cfg.model.hidden})" in source, "no load of the up half"
    assert "ulonglong4" not in source
    if shutil.which("nvcc"):
        with cuda():
            assert b".target sm_90" in nvcc.compile_cuda(source, target_format="ptx", compiler="nvcc")


@pytest.mark.parametrize(
    "proj, batch, layout",
    [
        ("in_proj_qkv", 1, (8, 32, 1, 8, 1)),  # 768 CTAs x 256 threads, x [1024] in smem
        ("in_proj_b", 1, (1, 256, 1, 1, 1)),  # N = 16: one row a CTA, K split over 8 warps
        ("in_proj_qkv", 32, (32, 32, 16, 2, 4)),  # 4 rows x 16 lanes a thread, 8 x 32 threads, 384 CTAs
        ("in_proj_z", 32, (16, 32, 16, 2, 4)),  # FLOP-bound: 4 x 32 threads, a warp per 4 rows, 256 CTAs
        ("out_proj", 64, (16, 32, 16, 2, 4)),  # the same from 8 lanes on, B tiles of 16 lanes: 256 CTAs
        ("in_proj_b", 32, (4, 256, 4, 1, 4)),  # 16 rows: too few for that, K split over 256 threads a row
        ("in_proj_b", 8, (1, 32, 8, 8, 1)),  # 4-15 lanes, < SMALL_WEIGHTS: a warp a row, one row a CTA
        ("out_proj", 4, (1, 32, 4, 16, 1)),  # the same: 1024 CTAs, x from L2
        ("lm_head", 1, (8, 32, 1, 8, 1)),  # 248,320 rows: 31,040 CTAs
    ],
)
def test_cuda_default_layout(proj, batch, layout):
    assert cuda_layout(_cfg(batch), proj) == layout


def test_small_gemv_bounds_are_the_library_gemm_bounds():
    """The small-weight layout is for the GEMVs a step keeps beside its library GEMMs: the same lanes and weights."""
    assert SMALL_LANES == (plan.LIBRARY_GEMM_MIN_LANES, plan.LIBRARY_GEMM_LANES)
    assert SMALL_WEIGHTS == plan.LIBRARY_GEMM_MIN_WEIGHT


def test_cuda_default_layout_of_an_odd_vocabulary():
    """From 8 lanes a thread takes 4 rows where they divide N; an LM head of 4,099 rows takes one."""
    cfg = _cfg(16).replace(vocab_size=4099)
    rows, _, _, _, per_thread = cuda_layout(cfg, "lm_head")
    assert (rows, per_thread) == (1, 1)
    assert cuda_layout(cfg.replace(vocab_size=4100), "lm_head")[4] == 4


@pytest.mark.parametrize(
    "model, proj, prologue, swiglu, layout",
    [
        ("qwen3.5-0.8b", "out_proj", "norm", False, (8, 32, 1, 8, 1)),  # 128 CTAs, a warp a row (and a head at a time)
        ("qwen3.5-0.8b", "in_proj", "rmsnorm", False, (16, 32, 1, 4, 2)),  # 514 CTAs of 16 rows, 2 a thread
        ("qwen3.5-0.8b", "gate_up_proj", "rmsnorm", True, (8, 32, 1, 4, 1)),  # 16 rows: 224 CTAs, < 2 an SM
        ("qwen3.5-4b", "gate_up_proj", "rmsnorm", True, (16, 32, 1, 10, 2)),  # 576 CTAs
        ("qwen3.5-9b", "in_proj", "rmsnorm", False, (8, 32, 1, 16, 1)),  # K = 4096: past PROLOGUE_COLS, plain
        ("qwen3.5-4b", "out_proj", "", False, (8, 32, 1, 16, 1)),  # no prologue: the plain default
    ],
)
def test_prologue_default_layouts_take_wider_ctas(model, proj, prologue, swiglu, layout):
    """Every CTA recomputes a prologue: the defaults give the CTA more rows than the plain GEMV's (PROLOGUE_ROWS)."""
    cfg = _cfg(1, model=model).replace(weight_dtype="bfloat16")
    assert cuda_layout(cfg, proj, prologue=prologue, swiglu=swiglu) == layout


@pytest.mark.parametrize(
    "batch, layout",
    [
        (1, (8, 32, 1, 8, 1)),  # 8 gate/up pairs (16 rows of w) a CTA, a warp a pair: 448 CTAs x 256 threads
        (32, (16, 32, 16, 2, 2)),  # FLOP-bound: 2 pairs (4 rows of w) x 16 lanes a thread, 448 CTAs
    ],
)
def test_swiglu_default_layout_counts_gate_up_pairs(batch, layout):
    assert cuda_layout(_cfg(batch), "gate_up_proj", swiglu=True) == layout


@pytest.mark.parametrize("batch, grid, warps", [(1, 248320 // 8, 8), (256, 248320 // 32 * 16, 8)])
def test_lm_head_grid_covers_the_vocabulary(batch, grid, warps):
    """The LM head's 248,320 rows of qwen3.5-27b's 5120 columns: the CTAs all on blockIdx.x (up to 2^31 - 1; y and
    z stop at 65,535), 8 rows a CTA at B = 1, 32 (4 a thread) x 16 B tiles of 16 lanes at B = 256; and the weight's
    elements fit the kernel's int32 indices. (The emulated kernel is checked at the test cases' vocabularies.)"""
    cfg = DecodeConfig(preset("qwen3.5-27b"), batch=batch, **F32)
    (launch,) = lower(OPS["gemv_lm_head"].schedule(cfg, "cuda").mod)[1]
    assert launch.grid == (grid, 1, 1) and launch.block == (32, warps, 1)
    assert max(m.vocab_size * m.hidden for m in PRESETS.values()) < 2**31


@pytest.mark.parametrize("model", PRESETS)
def test_mlp_gemvs_apply_where_the_mlp_is_dense(model):
    """`Op.applies`: every op but the dense MLP's (each GEMV variant, its library GEMMs, their split and SwiGLU) on
    the mixture-of-experts presets; the library GEMMs only with bf16 weights."""
    cfg = DecodeConfig(preset(model))
    missing = {name for name, op in OPS.items() if not op.applies(cfg)}
    mlp = {SWIGLU, "gemv_gate_up_proj_rmsnorm_swiglu", "gemv_down_proj", "gemv_down_proj_residual", "swiglu"}
    mlp |= {"gemm_gate_up_proj", "gemm_down_proj", "split_bf16_intermediate"}
    assert missing == (set() if cfg.model.intermediate_size else mlp)
    f32 = {name for name, op in OPS.items() if not op.applies(cfg.replace(**F32))}
    assert f32 == missing | {name for name in OPS if name.startswith("gemm_")}


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU")
@pytest.mark.parametrize("case", KNOBS)
def test_cuda_knobs_on_gpu(case, rng):
    proj, batch, knobs, _ = KNOBS[case]
    _check(f"gemv_{proj}", _cfg(batch), cuda(), rng, **knobs)


def test_reference_is_x_wT(rng):
    w, x = rng.standard_normal((7, 5)), rng.standard_normal((3, 5))
    y = np.full((3, 7), np.nan)
    OPS["gemv_in_proj_b"].reference(w=w, x=x, y=y)
    np.testing.assert_allclose(y, np.einsum("bk,nk->bn", x, w))


def test_swiglu_reference_is_silu_of_the_gate_rows_times_the_up_rows(rng):
    w, x = rng.standard_normal((8, 5)), rng.standard_normal((3, 5))
    y = np.full((3, 4), np.nan)
    OPS[SWIGLU].reference(w=w, x=x, y=y)
    gate, up = x @ w[:4].T, x @ w[4:].T
    np.testing.assert_allclose(y, gate / (1 + np.exp(-gate)) * up)
