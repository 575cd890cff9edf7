"""sample: each lane's next token from its logits: greedy, or temperature / top-k / top-p sampling with a counter-based
random number (docs/math.md, "Sampling").

Per-lane parameters are inputs, so one kernel serves every request: a `temperature` not above 0 (0, negative, NaN)
is greedy (the first index of the largest logit); otherwise the candidates are the tokens whose logit is at least
the `top_k`-th largest (all of them where `top_k <= 0` or `top_k >= V`; ties at that value all kept), narrowed to
the highest logits whose probability under `softmax(logits / temperature)` over those candidates reaches `top_p`
(where `top_p < 1`; ties again all kept), and the token is drawn by inverse CDF in index order with one uniform
number from Philox-4x32-10 (key: the lane's `seed`, counter: its `step`), so a step is reproduced exactly, eagerly
or in a replayed graph. Thresholds are found by bitwise search over an order-preserving 32-bit key of the logits
(one pass over the row per bit: no sort), the draw by bitwise search over the index (one pass per index bit).
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.argmax import peaked_logits
from gdn_tvm.philox import KEY_STEPS, MULTIPLIERS, ROUNDS, UNIFORM_BITS
from gdn_tvm.signature import Arg

KEY_BITS = 32  # bits of a logit's order key


def _temperatures(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """A mix of greedy lanes (0) and sampling temperatures in [0.3, 1.5)."""
    t = rng.uniform(0.3, 1.5, shape)
    return np.where(rng.random(shape) < 0.25, 0.0, t).astype(np.float32)


def _top_ks(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """0 (off), 1, small k and k past the vocabulary, mixed."""
    return rng.choice([0, 1, 2, 7, 40, 10**9], shape).astype(np.int32)


def _top_ps(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """1 (off) or p in [0.2, 1)."""
    return np.where(rng.random(shape) < 0.3, 1.0, rng.uniform(0.2, 1.0, shape)).astype(np.float32)


def _counters(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Any 64-bit value (seeds and steps use all their bits)."""
    return rng.integers(-(2**63), 2**63 - 1, shape, dtype=np.int64)


def signature(cfg: DecodeConfig) -> list[Arg]:
    """logits: [B, V] float32 (finite); temperature, top_p: [B] float32; top_k: [B] int32; seed, step: [B] int64
    -> tokens: [B] int32."""
    B, V = cfg.batch, cfg.model.vocab_size
    return [
        Arg("logits", (B, V), sample=peaked_logits),
        Arg("temperature", (B,), sample=_temperatures),
        Arg("top_k", (B,), "int32", sample=_top_ks),
        Arg("top_p", (B,), sample=_top_ps),
        Arg("seed", (B,), "int64", sample=_counters),
        Arg("step", (B,), "int64", sample=_counters),
        Arg("tokens", (B,), "int32", role="out"),
    ]


def order_key(x):
    """An unsigned 32-bit key of float32 `x` whose order is the floats' (negative values reversed below the positive
    ones; -0 just below +0): a TIR expression."""
    bits = T.reinterpret("uint32", x)
    negative = T.shift_right(bits, T.uint32(31)) == T.uint32(1)
    return T.Select(negative, T.bitwise_not(bits), T.bitwise_or(bits, T.uint32(0x80000000)))


def _bit(n, width: int):
    """`1 << (width - 1 - n)` as uint32: the bit a search fixes at its step `n` (most significant first)."""
    return T.shift_left(T.uint32(1), T.Cast("uint32", width - 1 - n))


def _mulhilo(m: int, x):
    """(high, low) 32-bit halves of the 64-bit product `m * x`: TIR expressions."""
    p = T.Cast("uint64", T.uint32(m)) * T.Cast("uint64", x)
    return T.Cast("uint32", T.shift_right(p, T.uint64(32))), T.Cast("uint32", p)


def _counter_word(step, b, w):
    """Word `w` of lane `b`'s initial Philox counter: the low and high halves of its 64-bit step, then two zero
    words: a TIR expression."""
    half = T.Cast("uint32", T.shift_right(T.Cast("uint64", step[b]), T.Cast("uint64", 32 * T.min(w, 1))))
    return T.Select(w < 2, half, T.uint32(0))


def _philox_round(ctr, seed, b, r, w):
    """Word `w` after Philox round `r` of lane `b`, from the counter words before it (`ctr[b, r, :]`) and the round's
    key (the lane's seed plus `r` key steps, per 32-bit half): a TIR expression."""

    def key(half: int):
        seed_half = T.Cast("uint32", T.shift_right(T.Cast("uint64", seed[b]), T.uint64(32 * half)))
        return seed_half + T.Cast("uint32", r) * T.uint32(KEY_STEPS[half])

    hi1, lo1 = _mulhilo(MULTIPLIERS[1], ctr[b, r, 2])
    hi0, lo0 = _mulhilo(MULTIPLIERS[0], ctr[b, r, 0])
    word0 = T.bitwise_xor(T.bitwise_xor(hi1, ctr[b, r, 1]), key(0))
    word2 = T.bitwise_xor(T.bitwise_xor(hi0, ctr[b, r, 3]), key(1))
    return T.Select(w == 0, word0, T.Select(w == 1, lo1, T.Select(w == 2, word2, lo0)))


def make_sample(cfg: DecodeConfig):
    """Per lane (blocks in order): "max" and "argmax" (the greedy token: the first index of the largest logit, the
    token the `argmax` op picks); "topk_carry" / "topk_count" / "topk_step" (the top-k threshold key, a bit a step);
    "topk_mass" (the candidates' total weight); "topp_carry" / "topp_mass" / "topp_step" (the top-p threshold key);
    "kept_mass" and "last" (the kept tokens' total weight and last index); "philox_carry" / "philox_round" (the
    uniform number); "cdf_carry" / "cdf_mass" / "cdf_step" (the drawn index, a bit a step); "token". A token's weight
    is `exp((logit - max) / temperature)`; it is kept when its key is at least both thresholds. A search's state
    before a step (written by its "carry" block: the start, or the previous step's result) and after it are separate
    buffers, so no block reads what it writes (schedules can then bind the lane loop)."""
    B, V = cfg.batch, cfg.model.vocab_size
    NB = V.bit_length()  # index bits: every index and V itself are below 2**NB
    R = ROUNDS

    def weight_if(cond, logits, vmax, temperature, b, i):
        """The token's weight where `cond` holds, else 0, as float64: sums of a vocabulary's weights are float64
        (in float32, a long tail of tiny weights added one by one drifts by a token's worth)."""
        w = T.exp((logits[b, i] - vmax[b]) / temperature[b])
        return T.Select(cond, T.Cast("float64", w), T.float64(0))

    def kept(logits, temperature, kth_step, pth_step, b, i):
        """Token i is a candidate of a lane that draws (a greedy lane keeps none: its passes read no logits)."""
        key = order_key(logits[b, i]) >= T.max(pth_step[b, KEY_BITS - 1], kth_step[b, KEY_BITS - 1])
        return T.And(drawing(temperature, b), key)

    def with_bit(key, n):
        return T.bitwise_or(key, _bit(n, KEY_BITS))

    def top_k_of(top_k, b):
        return T.Select(T.And(0 < top_k[b], top_k[b] < V), top_k[b], V)

    # Whether lane b needs a pass at all: a greedy lane needs only "max" and "argmax", a lane with top-k off no top-k
    # search, with top-p off no top-p search (nor the mass it compares with). A pass a lane skips reads no logits.
    def drawing(temperature, b):
        return temperature[b] > T.float32(0)

    def k_search(temperature, top_k, b):
        return T.And(drawing(temperature, b), T.And(0 < top_k[b], top_k[b] < V))

    def p_search(temperature, top_p, b):
        return T.And(drawing(temperature, b), top_p[b] < T.float32(1))

    def drawn_below(ctr_round, z, b):
        """`u * z`: the lane's uniform number (`UNIFORM_BITS` bits of Philox's first word) times the kept weight."""
        bits = T.shift_right(ctr_round[b, R - 1, 0], T.uint32(32 - UNIFORM_BITS))
        return T.Cast("float64", bits) * T.float64(2.0**-UNIFORM_BITS) * z[b]

    @T.prim_func(s_tir=True)
    def sample(
        logits: T.Buffer((B, V), "float32"),
        temperature: T.Buffer((B,), "float32"),
        top_k: T.Buffer((B,), "int32"),
        top_p: T.Buffer((B,), "float32"),
        seed: T.Buffer((B,), "int64"),
        step: T.Buffer((B,), "int64"),
        tokens: T.Buffer((B,), "int32"),
    ):
        T.func_attr({"tirx.noalias": True})
        vmax = T.sblock_alloc_buffer((B,), "float32")
        first = T.sblock_alloc_buffer((B,), "int32")
        count = T.sblock_alloc_buffer((B, KEY_BITS), "int32")
        kth = T.sblock_alloc_buffer((B, KEY_BITS), "uint32")  # top-k key before each step
        kth_step = T.sblock_alloc_buffer((B, KEY_BITS), "uint32")  # and after it
        zk = T.sblock_alloc_buffer((B,), "float64")
        mass = T.sblock_alloc_buffer((B, KEY_BITS), "float64")
        pth = T.sblock_alloc_buffer((B, KEY_BITS), "uint32")  # top-p key before each step
        pth_step = T.sblock_alloc_buffer((B, KEY_BITS), "uint32")  # and after it
        z = T.sblock_alloc_buffer((B,), "float64")
        after = T.sblock_alloc_buffer((B,), "int32")
        ctr = T.sblock_alloc_buffer((B, R, 4), "uint32")  # Philox counter before each round
        ctr_round = T.sblock_alloc_buffer((B, R, 4), "uint32")  # and after it
        below = T.sblock_alloc_buffer((B, NB), "float64")
        pos = T.sblock_alloc_buffer((B, NB), "int32")  # drawn index before each step
        pos_step = T.sblock_alloc_buffer((B, NB), "int32")  # and after it
        for b in range(B):
            for i in range(V):
                with T.sblock("max"):
                    vb, vi = T.axis.remap("SR", [b, i])
                    with T.init():
                        vmax[vb] = T.min_value("float32")
                    vmax[vb] = T.max(vmax[vb], logits[vb, vi])
            for i in range(V):
                with T.sblock("argmax"):
                    vb, vi = T.axis.remap("SR", [b, i])
                    with T.init():
                        first[vb] = T.max_value("int32")  # the min reducer's identity (TVM matches it)
                    first[vb] = T.min(first[vb], T.Select(logits[vb, vi] == vmax[vb], vi, T.max_value("int32")))
            for n in range(KEY_BITS):
                with T.sblock("topk_carry"):
                    vb, vn = T.axis.remap("SS", [b, n])
                    kth[vb, vn] = T.Select(vn == 0, T.uint32(0), kth_step[vb, T.max(vn - 1, 0)])
                for i in range(V):
                    with T.sblock("topk_count"):
                        vb, vn, vi = T.axis.remap("SSR", [b, n, i])
                        with T.init():
                            count[vb, vn] = 0
                        count[vb, vn] = count[vb, vn] + T.Select(
                            T.And(
                                k_search(temperature, top_k, vb), order_key(logits[vb, vi]) >= with_bit(kth[vb, vn], vn)
                            ),
                            1,
                            0,
                        )
                with T.sblock("topk_step"):
                    vb, vn = T.axis.remap("SS", [b, n])
                    kth_step[vb, vn] = T.Select(
                        count[vb, vn] >= top_k_of(top_k, vb), with_bit(kth[vb, vn], vn), kth[vb, vn]
                    )
            for i in range(V):
                with T.sblock("topk_mass"):
                    vb, vi = T.axis.remap("SR", [b, i])
                    with T.init():
                        zk[vb] = T.float64(0)
                    zk[vb] = zk[vb] + weight_if(
                        T.And(
                            p_search(temperature, top_p, vb), order_key(logits[vb, vi]) >= kth_step[vb, KEY_BITS - 1]
                        ),
                        logits, vmax, temperature, vb, vi,
                    )  # fmt: skip
            for n in range(KEY_BITS):
                with T.sblock("topp_carry"):
                    vb, vn = T.axis.remap("SS", [b, n])
                    pth[vb, vn] = T.Select(vn == 0, T.uint32(0), pth_step[vb, T.max(vn - 1, 0)])
                for i in range(V):
                    with T.sblock("topp_mass"):
                        vb, vn, vi = T.axis.remap("SSR", [b, n, i])
                        with T.init():
                            mass[vb, vn] = T.float64(0)
                        mass[vb, vn] = mass[vb, vn] + weight_if(
                            T.And(
                                p_search(temperature, top_p, vb),
                                order_key(logits[vb, vi])
                                >= T.max(with_bit(pth[vb, vn], vn), kth_step[vb, KEY_BITS - 1]),
                            ),
                            logits, vmax, temperature, vb, vi,
                        )  # fmt: skip
                with T.sblock("topp_step"):
                    vb, vn = T.axis.remap("SS", [b, n])
                    pth_step[vb, vn] = T.Select(
                        top_p[vb] < T.float32(1) and mass[vb, vn] >= T.Cast("float64", top_p[vb]) * zk[vb],
                        with_bit(pth[vb, vn], vn),
                        pth[vb, vn],
                    )
            for i in range(V):
                with T.sblock("kept_mass"):
                    vb, vi = T.axis.remap("SR", [b, i])
                    with T.init():
                        z[vb] = T.float64(0)
                    z[vb] = z[vb] + weight_if(
                        kept(logits, temperature, kth_step, pth_step, vb, vi),
                        logits, vmax, temperature, vb, vi,
                    )  # fmt: skip
            for i in range(V):
                with T.sblock("last"):  # as tokens after the last kept one: CUDA C++ reads -2147483648 as a long
                    vb, vi = T.axis.remap("SR", [b, i])
                    with T.init():
                        after[vb] = T.max_value("int32")
                    after[vb] = T.min(
                        after[vb],
                        T.Select(
                            kept(logits, temperature, kth_step, pth_step, vb, vi),
                            V - 1 - vi,
                            T.max_value("int32"),
                        ),
                    )
            for r in range(R):
                for w in range(4):
                    with T.sblock("philox_carry"):
                        vb, vr, vw = T.axis.remap("SSS", [b, r, w])
                        ctr[vb, vr, vw] = T.Select(
                            vr == 0, _counter_word(step, vb, vw), ctr_round[vb, T.max(vr - 1, 0), vw]
                        )
                for w in range(4):
                    with T.sblock("philox_round"):
                        vb, vr, vw = T.axis.remap("SSS", [b, r, w])
                        ctr_round[vb, vr, vw] = _philox_round(ctr, seed, vb, vr, vw)
            for n in range(NB):
                with T.sblock("cdf_carry"):
                    vb, vn = T.axis.remap("SS", [b, n])
                    pos[vb, vn] = T.Select(vn == 0, 0, pos_step[vb, T.max(vn - 1, 0)])
                for i in range(V):
                    with T.sblock("cdf_mass"):
                        vb, vn, vi = T.axis.remap("SSR", [b, n, i])
                        with T.init():
                            below[vb, vn] = T.float64(0)
                        below[vb, vn] = below[vb, vn] + weight_if(
                            vi < pos[vb, vn] + (1 << (NB - 1 - vn))
                            and kept(logits, temperature, kth_step, pth_step, vb, vi),
                            logits, vmax, temperature, vb, vi,
                        )  # fmt: skip
                with T.sblock("cdf_step"):
                    vb, vn = T.axis.remap("SS", [b, n])
                    pos_step[vb, vn] = T.Select(
                        pos[vb, vn] + (1 << (NB - 1 - vn)) <= V and below[vb, vn] <= drawn_below(ctr_round, z, vb),
                        pos[vb, vn] + (1 << (NB - 1 - vn)),
                        pos[vb, vn],
                    )
            with T.sblock("token"):
                vb = T.axis.spatial(B, b)
                tokens[vb] = T.Select(
                    temperature[vb] > T.float32(0),
                    T.Select(pos_step[vb, NB - 1] < V, pos_step[vb, NB - 1], V - 1 - after[vb]),
                    first[vb],
                )

    return sample
