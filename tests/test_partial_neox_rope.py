"""RoPE at large positions: float64 angles keep the kernel within 1e-4 of the float64 reference near 2^18."""

from __future__ import annotations

import re

import numpy as np
from conftest import F32, assert_close, cuda_source

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.verify import TOL_OP, reference_copy

OP = OPS["partial_neox_rope"]
LONG = DecodeConfig(preset("qwen3.5-4b"), batch=3, max_len=2**18 + 1, **F32)


def long_inputs(rng: np.random.Generator) -> dict:
    """Fresh inputs with the positions in the last 1000 below 2^18 (2^18 itself included)."""
    values = {a.name: sample(a, rng) for a in visible(OP.signature(LONG))}
    values["positions"] = (2**18 - np.array([0, *rng.integers(1, 1000, LONG.batch - 1)])).astype(np.int32)
    return values


def test_large_positions_llvm(rng):
    values = long_inputs(rng)
    expect = reference_copy(values)
    OP.reference(**expect)
    compile_op(OP, LONG, llvm())(**values)
    for out in ("q_out", "k_out"):
        assert_close(values[out], expect[out], TOL_OP, f"{OP.name}.{out}")


def test_float32_angles_would_fail(rng):
    """The case discriminates: the same rotation with float32 angles misses the 1e-4 contract."""
    values = reference_copy(long_inputs(rng))
    OP.reference(**values)
    half, n_rot = LONG.model.n_rot // 2, LONG.model.n_rot
    inv_freq = np.float32(LONG.model.rope_theta) ** (-2 * np.arange(half, dtype=np.float32) / np.float32(n_rot))
    angle = values["positions"].astype(np.float32)[:, None, None] * inv_freq
    q = values["q"]
    q_rot0 = q[..., :half] * np.cos(angle) - q[..., half:n_rot] * np.sin(angle)
    err = np.abs(q_rot0 - values["q_out"][..., :half]).max() / np.abs(values["q_out"]).max()
    assert err > TOL_OP


def test_cuda_angles_in_double():
    """sin/cos are the double-precision functions (fast-math turns float sinf/cosf into __sinf/__cosf)."""
    src = cuda_source(OP.name, LONG)
    assert re.search(r"\bsin\(", src) and re.search(r"\bcos\(", src) and "(double)" in src
    assert not re.search(r"sinf\(|cosf\(|__sinf|__cosf", src)
