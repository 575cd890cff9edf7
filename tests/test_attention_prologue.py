"""attention_prologue against the four kernels it replaces (split_interleaved, per_head_rmsnorm, partial_neox_rope,
kv_row_scatter), run one after another on the same inputs: the same q, gate and cache rows, bit for bit on llvm."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from conftest import BF16_CASES, CASES

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.plan import attention
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.target import llvm


@pytest.mark.parametrize("case", ["4b-B3", "0.8b-B1-bf16"])
def test_fused_prologue_writes_what_the_four_kernels_write(case, rng):
    cfg = (CASES | BF16_CASES)[case]
    op = OPS["attention_prologue"]
    values = {a.name: sample(a, rng) for a in visible(op.signature(cfg))}

    def tensors(**arrays):  # tvm tensors (numpy's bf16 does not cross DLPack): the caches are written in place
        return {name: tvm.runtime.tensor(np.copy(a)) for name, a in arrays.items()}

    def run(name: str, **args) -> None:
        compile_op(OPS[name], cfg, llvm())(**args)

    fused = tensors(**values)
    run("attention_prologue", **fused)
    chain = tensors(**values)
    q_shape, k_shape = values["q_out"].shape, values["k"].shape
    work = tensors(
        **{n: np.empty(q_shape, np.float32) for n in ("q", "q_normed", "q_rotated")},
        **{n: np.empty(k_shape, np.float32) for n in ("k_normed", "k_rotated")},
    )
    index = {"slots": chain["slots"], "positions": chain["positions"]}
    run("split_interleaved", src=chain["q_gate"], q=work["q"], gate=chain["gate"])
    norms = {"q_norm": chain["q_norm"], "k_norm": chain["k_norm"]}
    run("per_head_rmsnorm", q=work["q"], k=chain["k"], **norms, q_out=work["q_normed"], k_out=work["k_normed"])
    rope = {"q": work["q_normed"], "k": work["k_normed"], "positions": index["positions"]}
    run("partial_neox_rope", **rope, q_out=work["q_rotated"], k_out=work["k_rotated"])
    caches = {"k_cache": chain["k_cache"], "v_cache": chain["v_cache"]}
    run("kv_row_scatter", k=work["k_rotated"], v=chain["v"], **caches, **index)
    chain["q_out"] = work["q_rotated"]
    for name in ("q_out", "gate", "k_cache", "v_cache"):
        assert np.array_equal(fused[name].numpy(), chain[name].numpy(), equal_nan=True), name


def test_attention_layer_launches_the_fused_prologue():
    for cfg in (CASES["0.8b-B1"], CASES["4b-B3"]):
        ops = attention(cfg).ops
        assert "attention_prologue" in ops
        assert not {"split_interleaved", "per_head_rmsnorm", "partial_neox_rope", "kv_row_scatter"} & set(ops)
