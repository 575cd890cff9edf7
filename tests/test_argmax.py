"""argmax (llvm and the emulated CUDA kernel) on rows that probe its two stages: the largest value in the last,
partial chunk; equal maxima in two chunks and in one; rows of one value; -inf entries, chunks and rows. Every output
(the chunk scratch too) is compared with the reference bit for bit, and the tokens with `np.argmax`."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
from conftest import CASES, check_kernel_against_reference
from cuda_emu import emulated, lower

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.registry import OPS
from gdn_tvm.signature import ArgumentError, poisoned, sample, visible
from gdn_tvm.target import llvm
from gdn_tvm.tuning.space import knob_grid
from gdn_tvm.verify import mismatch, reference_copy

OP = OPS["argmax"]
CFG = CASES["4b-B3"]  # 3 lanes of V = 997 logits: 16 chunks of 63, the last of 52
V, C = CFG.model.vocab_size, CFG.argmax_chunks
L = -(-V // C)
LAST = (C - 1) * L  # the last chunk's first index
LOWEST = np.finfo(np.float32).min  # the max reduction's start
TARGETS = ["llvm", "cuda"]


@cache
def _kernel(target: str):
    if target == "llvm":
        return compile_op(OP, CFG, llvm())
    return emulated(OP, CFG, *lower(OP.schedule(CFG, "cuda").mod))


def _argmax(target: str, logits: np.ndarray) -> np.ndarray:
    """The kernel's tokens for `logits` [B, V], after checking every output against the reference."""
    values = _unwritten()
    values["logits"] = logits.astype(np.float32)
    expect = reference_copy(values)
    OP.run_reference(CFG, expect)
    _kernel(target)(**values)
    for name in ("chunk_max", "chunk_first", "tokens", "arrivals"):
        why = mismatch(values[name], expect[name], 0)
        assert why is None, f"{name}: {why}"
    assert values["tokens"].tolist() == np.argmax(logits, axis=1).tolist()
    return values["tokens"]


def _unwritten() -> dict[str, np.ndarray]:
    """Every argument as a launch finds it before its inputs are filled: outputs poisoned, the counters at zero (the
    value `signature.sample` gives them)."""
    return {a.name: sample(a, None) if a.role == "counter" else poisoned(a) for a in visible(OP.signature(CFG))}


def _rows(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(-4.0, 4.0, (CFG.batch, V)).astype(np.float32)


def test_chunks_cover_the_row_and_none_is_empty():
    """256 chunks of 970 logits at Qwen3.5's vocabulary; at any V at most 256, each of ceil(V / C) but the last (1 to
    that many); this file's case ends in a partial chunk."""
    assert (CFG.replace(vocab_size=248320).argmax_chunks, -(-248320 // 256)) == (256, 970)
    for v in (*range(1, 3000), 64 * 256 + 1, 200003, 10**6 + 7):
        chunks = CFG.replace(vocab_size=v).argmax_chunks
        length = -(-v // chunks)
        assert chunks <= 256 and 1 <= v - (chunks - 1) * length <= length, v
    assert C > 1 and 0 < V - LAST < L


@pytest.mark.parametrize("target", TARGETS)
def test_largest_in_the_last_partial_chunk(target, rng):
    logits = _rows(rng)
    for lane, index in enumerate((V - 1, LAST, LAST + 17)):
        logits[lane, index] = 5.0
    assert _argmax(target, logits).tolist() == [V - 1, LAST, LAST + 17]


@pytest.mark.parametrize("target", TARGETS)
def test_the_first_of_equal_maxima_wins(target, rng):
    """Lane 0: in two chunks; lane 1: twice in one chunk (its own first index); lane 2: twice in the partial last
    chunk and once before it."""
    logits = _rows(rng)
    ties = ([3 * L + 5, 9 * L + 1], [2 * L + 40, 2 * L + 7], [LAST + 30, LAST + 2, 4 * L + 62])
    for lane, indices in enumerate(ties):
        logits[lane, indices] = 5.0
    assert _argmax(target, logits).tolist() == [min(t) for t in ties]


@pytest.mark.parametrize("target", TARGETS)
def test_a_row_of_one_value_picks_its_first_index(target):
    logits = np.repeat(np.float32([0.0, -3.5, LOWEST])[:, None], V, axis=1)
    assert _argmax(target, logits).tolist() == [0, 0, 0]


@pytest.mark.parametrize("target", TARGETS)
def test_minus_infinity(target, rng):
    """Lane 0: -inf scattered, and filling the first and the last chunk; lane 1: -inf but for two of the lowest
    finite value (the max's start: the first of them still wins); lane 2: all -inf (index 0, as `np.argmax`)."""
    logits = _rows(rng)
    logits[0, rng.random(V) < 0.5] = -np.inf
    logits[0, :L] = logits[0, LAST:] = -np.inf
    logits[1:] = -np.inf
    logits[1, [8 * L + 3, 2 * L + 9]] = LOWEST
    assert _argmax(target, logits).tolist() == [int(np.argmax(logits[0])), 2 * L + 9, 0]


@pytest.mark.parametrize("cfg", [CFG, CASES["0.8b-B1"].replace(vocab_size=200003)], ids=["V997", "V200003"])
def test_every_cuda_design_matches_reference(cfg, rng):
    """Each CTA width of the knob grid on the emulated CUDA kernel, wider than a chunk (63 logits) and narrower (782,
    256 chunks, the last of 593)."""
    for knobs in knob_grid(OP, "cuda"):
        kernel = emulated(OP, cfg, *lower(OP.schedule(cfg, "cuda", **knobs).mod))
        check_kernel_against_reference(OP, cfg, kernel, rng)


@pytest.mark.parametrize("target", TARGETS)
def test_each_launch_leaves_the_counters_at_zero(target, rng):
    """Launches one after another on the same counters (a replayed graph's): each finds them at zero, draws every
    lane's tokens in the chunk that arrives last and leaves them at zero."""
    kernel, logits = _kernel(target), _rows(rng)
    values = _unwritten()
    for _ in range(3):
        logits = np.roll(logits, 101, axis=1)
        kernel(**{**values, "logits": logits})
        assert values["tokens"].tolist() == np.argmax(logits, axis=1).tolist()
        assert not values["arrivals"].any()


def test_a_counter_left_mid_launch_is_refused(rng):
    """A counter that is not zero (a launch cut short, or a buffer that is not one) is refused by name, the outputs
    left as they were: the chunks would never see their last arrival."""
    values = _unwritten()
    values["logits"], values["arrivals"][1] = _rows(rng), 5
    with pytest.raises(ArgumentError, match=r"arrivals: arrival counters must be zero"):
        _kernel("llvm")(**values)
    assert (values["tokens"] == np.iinfo(np.int32).min).all()
