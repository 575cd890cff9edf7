"""Split-KV decode attention in stages (llvm): split vs its reference, reduce (which also applies the output gate)
vs its reference (empty splits hold NaN, which reduce must not read), then split + reduce against the unsplit
reference and a plain float64 softmax, each gated, at sequence lengths 1, a split boundary, between and max_len."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import F32, assert_close
from gdn_tvm.schedules.decode_attention import cuda_warps

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.ops import decode_attention_reduce as reduce_ops
from gdn_tvm.ops.decode_attention_reduce import reduce_layout
from gdn_tvm.reference.activations import sigmoid
from gdn_tvm.reference.decode_attention import decode_attention, decode_attention_split
from gdn_tvm.reference.decode_attention_reduce import decode_attention_reduce
from gdn_tvm.registry import OPS
from gdn_tvm.target import llvm
from gdn_tvm.verify import TOL_OP

# 40 splits: more than the reduce's 32 split groups, so some groups merge several splits and, at short lengths,
# some are empty; D spreads over 4 reduce chunks.
CFG = DecodeConfig(preset("qwen3.5-4b"), batch=3, slots=4, max_len=320, split_len=8, **F32)
# 8 x 16 = 128 (lane, head) rows: the reduce's other layout, one block per (lane, head) in 8 groups of 12 splits.
WIDE = DecodeConfig(preset("qwen3.5-4b"), batch=8, slots=8, max_len=96, split_len=8, **F32)
SEQ_LENS = [1, CFG.split_len, CFG.split_len + 1, 75, 270, CFG.max_len]


@pytest.fixture(scope="module")
def kernels():
    names = ("decode_attention_split", "decode_attention_reduce", "decode_attention")
    return {n: compile_op(OPS[n], CFG, llvm()) for n in names}


def _inputs(rng, seq_len: int) -> dict:
    m = CFG.model
    cache = (CFG.slots, CFG.max_len, m.n_kv_heads, m.head_dim)
    return {
        "q": rng.standard_normal((CFG.batch, m.n_q_heads, m.head_dim)).astype(np.float32),
        "k_cache": rng.standard_normal(cache).astype(np.float32),
        "v_cache": rng.standard_normal(cache).astype(np.float32),
        "slots": np.array([2, -1, 0], np.int32),
        "positions": np.array([seq_len - 1, 0, max(seq_len - 2, 0)], np.int32),
    }


def _gate(rng, cfg: DecodeConfig = CFG) -> np.ndarray:
    """The attention layer's output gate logits: [B, Hq, D]."""
    return (2 * rng.standard_normal((cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim))).astype(np.float32)


def _partials() -> dict:
    m = CFG.model
    shape = (CFG.batch, m.n_q_heads, CFG.n_splits)
    return {"m": np.full(shape, np.nan, np.float32), "l": np.full(shape, np.nan, np.float32),
            "acc": np.full(shape + (m.head_dim,), np.nan, np.float32)}  # fmt: skip


def _softmax_attention(x: dict, b: int) -> np.ndarray:
    """Plain float64 softmax attention of lane b: [Hq, D]."""
    hq, hkv = CFG.model.n_q_heads, CFG.model.n_kv_heads
    s, n = x["slots"][b], x["positions"][b] + 1
    out = np.empty((hq, CFG.model.head_dim))
    for h in range(hq):
        k = x["k_cache"][s, :n, h // (hq // hkv)].astype(np.float64)
        v = x["v_cache"][s, :n, h // (hq // hkv)].astype(np.float64)
        w = np.exp(k @ x["q"][b, h] / np.sqrt(k.shape[1]) - (k @ x["q"][b, h] / np.sqrt(k.shape[1])).max())
        out[h] = w @ v / w.sum()
    return out


@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_split_then_reduce(kernels, rng, seq_len):
    x = _inputs(rng, seq_len)
    got = _partials()
    kernels["decode_attention_split"](**x, **got)
    expect = {k: v.astype(np.float64) for k, v in _partials().items()}
    decode_attention_split(**{k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in x.items()},
                           **expect, split_len=CFG.split_len)  # fmt: skip
    for name in ("m", "l", "acc"):
        assert_close(got[name], expect[name], TOL_OP, f"split.{name}")  # NaN exactly on the unwritten splits

    out = np.full((CFG.batch, CFG.model.n_q_heads, CFG.model.head_dim), np.nan, np.float32)
    reduce_args = {"gate": _gate(rng), "slots": x["slots"], "positions": x["positions"]}
    kernels["decode_attention_reduce"](**got, **reduce_args, out=out)
    ref = np.full(out.shape, np.nan)
    decode_attention_reduce(**expect, **reduce_args, out=ref, split_len=CFG.split_len)
    assert_close(out, ref, TOL_OP, "reduce.out")

    unsplit = np.full(out.shape, np.nan)
    decode_attention(**{k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in x.items()}, out=unsplit)
    gated = sigmoid(reduce_args["gate"].astype(np.float64))
    assert_close(out, unsplit * gated, TOL_OP, "split+reduce vs unsplit reference, gated")
    whole = np.full(out.shape, np.nan, np.float32)
    kernels["decode_attention"](**x, out=whole)
    assert_close(whole, unsplit, TOL_OP, "unsplit kernel")
    for b in np.flatnonzero(x["slots"] >= 0):
        assert_close(out[b], _softmax_attention(x, b) * gated[b], TOL_OP, f"split+reduce vs softmax, lane {b}")


def test_reduce_never_reads_empty_splits(kernels, rng):
    x = _inputs(rng, CFG.split_len + 1)
    got = _partials()
    kernels["decode_attention_split"](**x, **got)  # splits past each sequence stay NaN
    out = np.full((CFG.batch, CFG.model.n_q_heads, CFG.model.head_dim), np.nan, np.float32)
    kernels["decode_attention_reduce"](**got, gate=_gate(rng), slots=x["slots"], positions=x["positions"], out=out)
    assert np.isfinite(out[x["slots"] >= 0]).all() and np.isnan(out[x["slots"] < 0]).all()


@pytest.mark.parametrize("seq_len", [CFG.split_len + 3, 75])
def test_rows_past_the_sequence_are_never_used(kernels, rng, seq_len):
    """Cache rows past each lane's position hold NaN (stale or never written): the split reads K rows up to its chunk's
    end and masks their scores, and reads V only at valid rows, so split + reduce and unsplit stay exact."""
    x = _inputs(rng, seq_len)
    ref = np.full((CFG.batch, CFG.model.n_q_heads, CFG.model.head_dim), np.nan)
    decode_attention(**{k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in x.items()}, out=ref)
    for b in np.flatnonzero(x["slots"] >= 0):
        for cache in ("k_cache", "v_cache"):
            x[cache][x["slots"][b], x["positions"][b] + 1 :] = np.nan
    got = _partials()
    kernels["decode_attention_split"](**x, **got)
    out = np.full(ref.shape, np.nan, np.float32)
    gate = _gate(rng)
    kernels["decode_attention_reduce"](**got, gate=gate, slots=x["slots"], positions=x["positions"], out=out)
    assert_close(out, ref * sigmoid(gate.astype(np.float64)), TOL_OP, "split+reduce over NaN rows past the sequence")
    whole = np.full(ref.shape, np.nan, np.float32)
    kernels["decode_attention"](**x, out=whole)
    assert_close(whole, ref, TOL_OP, "unsplit over NaN rows past the sequence")


def test_reduce_layouts_by_rows():
    assert reduce_layout(CFG) == (32, 64) and reduce_layout(WIDE) == (8, WIDE.model.head_dim)
    assert [reduce_layout(DecodeConfig(preset("qwen3.5-4b"), batch=b, **F32))[0] for b in (32, 128, 256)] == [8, 2, 1]


@pytest.mark.parametrize("layout", ["chunked", "wide-8-groups", "wide-1-group"])
def test_reduce_layouts_against_reference(layout, rng, monkeypatch):
    """Each reduce layout against the reference on random partials: NaN on the splits past each sequence, and maxima
    spread over +-150 (a masked split's weight must not overflow to inf, which times 0 is NaN)."""
    cfg = CFG if layout == "chunked" else WIDE
    if layout == "wide-1-group":
        monkeypatch.setattr(reduce_ops, "DEFAULT_GPU", dataclasses.replace(reduce_ops.DEFAULT_GPU, sms=1))
    assert reduce_layout(cfg)[0] == {"chunked": 32, "wide-8-groups": 8, "wide-1-group": 1}[layout]
    shape = (cfg.batch, cfg.model.n_q_heads, cfg.n_splits)
    positions = rng.integers(0, cfg.max_len, cfg.batch).astype(np.int32)
    positions[:3] = [0, cfg.split_len, cfg.max_len - 1]
    past = np.broadcast_to(np.arange(cfg.n_splits) > (positions // cfg.split_len)[:, None, None], shape)
    parts = {"m": rng.uniform(-150.0, 150.0, shape), "l": rng.uniform(0.5, 2.0, shape),
             "acc": rng.standard_normal(shape + (cfg.model.head_dim,))}  # fmt: skip
    for v in parts.values():
        v[past] = np.nan
    slots = np.arange(cfg.batch, dtype=np.int32)
    slots[1] = -1
    parts["gate"] = _gate(rng, cfg)
    out = np.full((cfg.batch, cfg.model.n_q_heads, cfg.model.head_dim), np.nan, np.float32)
    kernel = compile_op(OPS["decode_attention_reduce"], cfg, llvm())
    kernel(**{k: v.astype(np.float32) for k, v in parts.items()}, slots=slots, positions=positions, out=out)
    ref = np.full(out.shape, np.nan)
    decode_attention_reduce(**parts, slots=slots, positions=positions, out=ref, split_len=cfg.split_len)
    assert_close(out, ref, TOL_OP, f"reduce.out ({layout})")


def test_split_warps_follow_the_count_of_ctas():
    """16 warps a CTA while few CTAs (B=1 at 4096 rows: 64 and 128), 8 at 1024 (B=1 at 32k), 2 at 4096 (B=32); the
    shared-memory limit caps qwen3.5-27b (6 query heads a kv head) at 8."""
    warps = {
        (name, batch, rows): cuda_warps(DecodeConfig(preset(name), batch=batch, max_len=rows, **F32), True, None, 4)
        for name, batch, rows in [("qwen3.5-0.8b", 1, 4096), ("qwen3.5-4b", 1, 4096), ("qwen3.5-4b", 1, 32768),
                                  ("qwen3.5-4b", 32, 4096), ("qwen3.5-27b", 1, 4096)]
    }  # fmt: skip
    assert list(warps.values()) == [16, 16, 8, 2, 8]
