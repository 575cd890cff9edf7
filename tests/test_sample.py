"""Sampling: the Philox generator against its published known-answer vectors; the kernel (llvm and the emulated CUDA
kernel, its chain of launches) against the reference over the whole 248,320-token vocabulary, token ids exactly;
greedy ties; the draw's frequencies against the distribution it samples."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CASES, check_kernel_against_reference
from cuda_emu import emulated, lower

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import preset
from gdn_tvm.philox import philox4x32, uniform
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample as draw
from gdn_tvm.signature import visible
from gdn_tvm.target import llvm
from gdn_tvm.tuning.space import knob_grid
from gdn_tvm.verify import reference_copy

OP = OPS["sample"]
FULL = CASES["4b-B3"].replace(vocab_size=preset("qwen3.5-4b").vocab_size)  # 3 lanes of 248,320 logits
SMALL = CASES["4b-B3"].replace(vocab_size=1000)
TINY = CASES["4b-B3"].replace(vocab_size=333)  # 6 chunks, the last one shorter


def _emulated(cfg, **knobs):
    return emulated(OP, cfg, *lower(OP.schedule(cfg, "cuda", **knobs).mod))


# Random123's kat_vectors for philox4x32_10: (counter, key, output).
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "words"), KNOWN_ANSWERS)
def test_philox_matches_the_published_known_answers(counter, key, words):
    assert philox4x32(counter, key) == words


def _kernel(cfg, target: str):
    if target == "llvm":
        return compile_op(OP, cfg, llvm())
    return _emulated(cfg, threads=128)


def test_whole_vocabulary_tokens_match_reference(rng):
    """Three draws of three lanes each (greedy, top-k, top-p and plain sampling mixed), token ids exactly."""
    kernel = _kernel(FULL, "llvm")
    for _ in range(3):
        check_kernel_against_reference(OP, FULL, kernel, rng)


def test_whole_vocabulary_cuda_chain_matches_reference(rng):
    """The emulated CUDA chain (256 CTAs a lane) on two lanes, both drawing with top-k and top-p on: token ids
    exactly (one draw: the emulator runs the chain's ~18 million threads in about a minute)."""
    cfg = FULL.replace(batch=2)
    kernel = _emulated(cfg, threads=128)
    values = _values(cfg, rng, temperature=[0.7, 1.3], top_k=[50, 4000], top_p=[0.9, 0.6])
    expect = reference_copy(values)
    OP.run_reference(cfg, expect)
    kernel(**values)
    assert values["tokens"].tolist() == expect["tokens"].tolist()


def _values(cfg, rng, **fixed) -> dict:
    values = {a.name: draw(a, rng) for a in visible(OP.signature(cfg))}
    return values | {k: np.asarray(v, dtype=values[k].dtype) for k, v in fixed.items()}


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_greedy_picks_the_first_of_equal_maxima(target, rng):
    """A temperature not above 0 (0, negative, NaN) is greedy; the lowest index wins a tie."""
    kernel = _kernel(SMALL, target)
    values = _values(SMALL, rng, temperature=[0.0, -1.0, np.nan])  # each greedy
    top = values["logits"].max() + 1
    values["logits"][:, [7, 3, 900]] = top
    kernel(**values)
    assert values["tokens"].tolist() == [3] * SMALL.batch


def test_a_draw_is_a_function_of_seed_and_step(rng):
    """Same (seed, step): same token, run after run; the tokens of 400 steps follow the top-k / top-p distribution
    (chi-square), and top_k = 1 is greedy."""
    kernel = _kernel(SMALL, "llvm")
    values = _values(SMALL, rng, temperature=[0.8] * 3, top_k=[0, 5, 1], top_p=[0.9, 1.0, 1.0])
    values["logits"][:] = 2.0 * rng.standard_normal(SMALL.model.vocab_size).astype(np.float32)
    counts = np.zeros((SMALL.batch, SMALL.model.vocab_size))
    for step in range(400):
        values["step"][:] = step
        kernel(**values)
        again = dict(values, tokens=np.full_like(values["tokens"], -1))
        kernel(**again)
        assert np.array_equal(again["tokens"], values["tokens"])
        counts[np.arange(SMALL.batch), values["tokens"]] += 1
    logits = values["logits"][0].astype(np.float64)
    assert (counts[2] == 400)[int(np.argmax(logits))]
    p = np.exp((logits - logits.max()) / 0.8)
    k5 = p * (logits >= np.sort(logits)[-5])
    order = np.argsort(-logits)
    cum = np.cumsum(p[order]) / p.sum()
    p9 = np.zeros_like(p)
    p9[order[: int(np.searchsorted(cum, 0.9)) + 1]] = p[order[: int(np.searchsorted(cum, 0.9)) + 1]]
    for lane, probs in ((0, p9), (1, k5)):
        expect = 400 * probs / probs.sum()
        assert counts[lane][expect == 0].sum() == 0, f"lane {lane}: a token outside the kept set"
        big = expect >= 5
        chi2 = (((counts[lane] - expect) ** 2)[big] / expect[big]).sum()
        assert chi2 < 3 * big.sum() + 30, f"lane {lane}: chi-square {chi2:.1f} over {big.sum()} tokens"


def test_reference_uniform_is_philox_of_seed_and_step():
    assert uniform(0, 0) == (0x6627E8D5 >> 8) * 2.0**-24
    words = philox4x32((0xFFFFFFFF, 0xFFFFFFFF, 0, 0), (0xFFFFFFFF, 0xFFFFFFFF))
    assert uniform(-1, -1) == (words[0] >> 8) * 2.0**-24


def test_every_cuda_design_matches_reference(rng):
    """Each CTA width of the knob grid on the emulated CUDA kernel, at a vocabulary none of them divides."""
    for knobs in knob_grid(OP, "cuda"):
        check_kernel_against_reference(OP, TINY, _emulated(TINY, **knobs), rng)
