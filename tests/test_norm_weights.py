"""Zero-centred RMSNorm weights in bf16: the kernels read `w` as stored and add the 1 in float32, so they give the
answer of Hugging Face's own Qwen3.5 RMSNorm (`x * rsqrt(mean(x^2) + eps) * (1 + w.float())`) within the bf16 per-op
tolerance, on weights where `1 + w` rounded to bf16 (what the loader once stored) would not."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
import tvm
from conftest import BF16_CASES, assert_close
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5RMSNorm

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.reference.common import stored
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.verify import mismatch, tolerance

CFG = BF16_CASES["4b-B3-bf16"]
# op -> one (rows it normalises, from its float32 inputs; weight; output) per norm it applies
NORMS = {
    "per_head_rmsnorm": [(lambda v: v["q"], "q_norm", "q_out"), (lambda v: v["k"], "k_norm", "k_out")],
    "add_rmsnorm": [(lambda v: v["x"] + v["residual"], "weight", "y")],  # the float32 sum, as the kernel forms it
    "rmsnorm": [(lambda v: v["x"], "weight", "y")],
}


def midpoint_weights(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """bf16 weights `(2j + 1) * 2^-8`, j in 0..7 (exact in bf16), whose `1 + w` lies halfway between two bf16
    neighbours (2^-7 apart): rounded to bf16 it is 2^-8 off, 4e-3 relative, at every element."""
    return ((2 * rng.integers(0, 8, shape) + 1) * 2.0**-8).astype(ml_dtypes.bfloat16)


def hugging_face_rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """`transformers`' Qwen3.5 RMSNorm of float32 rows `x` [..., n] with the bf16 weight `w` [n] as its parameter."""
    norm = Qwen3_5RMSNorm(w.shape[-1], eps=eps)
    with torch.no_grad():
        norm.weight = torch.nn.Parameter(torch.from_numpy(w.astype(np.float32)).to(torch.bfloat16))  # exact
        return norm(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("name", NORMS)
def test_bf16_zero_centred_weights_give_hugging_faces_answer(name, rng):
    op, eps, tol = OPS[name], CFG.model.rms_norm_eps, tolerance(["bfloat16"])
    values = {a.name: sample(a, rng) for a in visible(op.signature(CFG))}
    for _, weight, _ in NORMS[name]:
        values[weight] = midpoint_weights(values[weight].shape, rng)
    tensors = {k: tvm.runtime.tensor(v) for k, v in values.items()}  # numpy exports no bf16 through DLPack
    compile_op(op, CFG, llvm())(**tensors)
    for rows, weight, out in NORMS[name]:
        x, w = rows(values), values[weight]
        want = hugging_face_rmsnorm(x, w, eps)
        assert_close(tensors[out].numpy(), want, tol, f"{name}.{out}")
        x64 = x.astype(np.float64)
        one_plus_w_in_bf16 = x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + eps) * stored(1.0 + w, "bfloat16")
        assert mismatch(one_plus_w_in_bf16, want, tol), f"{name}.{out}: the weights do not tell the two apart"
