"""gemv: schedule knobs off the defaults (predicated B tiles, several smem chunks, one row per CTA) against the
reference, and the CUDA design in the generated source (float4 weight loads, x in shared memory, shuffles)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from conftest import check_kernel_against_reference, cuda_source
from gdn_tvm.schedules.gemv import cuda_layout
from tvm.support import nvcc

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import DecodeConfig, preset
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


def _cfg(batch: int) -> DecodeConfig:
    return DecodeConfig(preset("qwen3.5-0.8b"), batch=batch)


def _check(name: str, cfg: DecodeConfig, target, rng, **knobs) -> None:
    op = OPS[name]
    check_kernel_against_reference(op, cfg, compile_op(op, cfg, target, **knobs), rng)


@pytest.mark.parametrize("batch", [5, 17])
@pytest.mark.parametrize("proj", ["in_proj_b", "out_proj"])
def test_llvm_batch_tiles(proj, batch, rng):
    _check(f"gemv_{proj}", _cfg(batch), llvm(), rng, batch_tile=3)


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


@pytest.mark.parametrize(
    "proj, batch, layout",
    [
        ("in_proj_qkv", 1, (8, 32, 1, 8, 1)),  # 768 CTAs x 256 threads, x [1024] in smem
        ("in_proj_b", 1, (1, 256, 1, 1, 1)),  # N = 16: one row a CTA, K split over 8 warps
        ("in_proj_qkv", 32, (32, 32, 16, 2, 4)),  # 4 rows x 16 lanes a thread, 8 x 32 threads, 384 CTAs
        ("in_proj_z", 32, (16, 32, 16, 2, 4)),  # FLOP-bound: 4 x 32 threads, a warp per 4 rows, 256 CTAs
        ("out_proj", 64, (16, 32, 16, 2, 4)),  # the same from 8 lanes on, B tiles of 16 lanes: 256 CTAs
        ("in_proj_b", 32, (4, 256, 4, 1, 4)),  # 16 rows: too few for that, K split over 256 threads a row
    ],
)
def test_cuda_default_layout(proj, batch, layout):
    assert cuda_layout(_cfg(batch), proj) == layout


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
