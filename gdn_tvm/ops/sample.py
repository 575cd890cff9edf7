"""sample: each lane's next token from its logits: greedy, or temperature / top-k / top-p sampling with a counter-based
random number (docs/math.md, "Sampling").

Per-lane parameters are inputs, so one kernel serves every request: a `temperature` not above 0 (0, negative, NaN)
is greedy (the first index of the largest logit); otherwise the candidates are the tokens whose logit is at least
the `top_k`-th largest (all of them where `top_k <= 0` or `top_k >= V`; ties at that value all kept), narrowed to
the highest logits whose probability under `softmax(logits / temperature)` over those candidates reaches `top_p`
(where `top_p < 1`; ties again all kept), and the token is drawn by inverse CDF in index order with one uniform
number from Philox-4x32-10 (key: the lane's `seed`, counter: its `step`), so a step is reproduced exactly, eagerly
or in a replayed graph. Thresholds are found by search over an order-preserving 32-bit key of the logits, two bits a
step (no sort), the draw by bitwise search over the chunks of the row, then over the chosen chunk's tokens. A chain of
launches, each a CTA per (lane, chunk) of the row, shares every pass over a lane's row among C CTAs.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import KEY_BITS, SEARCH_DIGIT_BITS, DecodeConfig
from gdn_tvm.philox import KEY_STEPS, MULTIPLIERS, ROUNDS, UNIFORM_BITS
from gdn_tvm.signature import Arg, peaked_logits


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
    -> tokens: [B] int32, with the workspace of `scratch`."""
    B, V = cfg.batch, cfg.model.vocab_size
    return [
        Arg("logits", (B, V), sample=peaked_logits),
        Arg("temperature", (B,), sample=_temperatures),
        Arg("top_k", (B,), "int32", sample=_top_ks),
        Arg("top_p", (B,), sample=_top_ps),
        Arg("seed", (B,), "int64", sample=_counters),
        Arg("step", (B,), "int64", sample=_counters),
        Arg("tokens", (B,), "int32", role="out"),
        *scratch(cfg),
    ]


def order_key(x):
    """An unsigned 32-bit key of float32 `x` whose order is the floats' (negative values reversed below the positive
    ones; -0 just below +0): a TIR expression."""
    bits = T.reinterpret("uint32", x)
    negative = T.shift_right(bits, T.uint32(31)) == T.uint32(1)
    return T.Select(negative, T.bitwise_not(bits), T.bitwise_or(bits, T.uint32(0x80000000)))


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


STEPS = KEY_BITS // SEARCH_DIGIT_BITS  # steps of a threshold search
TRIES = 2**SEARCH_DIGIT_BITS - 1  # thresholds a step tries
FIELD = 64 // TRIES  # bits of a try's count where one uint64 sums them all (a count is at most V < 2^FIELD)


def scratch(cfg: DecodeConfig) -> list[Arg]:
    """The chain's workspace (`DecodeConfig.sample_workspace`)."""
    return [Arg(name, shape, dtype, role="scratch") for name, (shape, dtype) in cfg.sample_workspace.items()]


def make_sample(cfg: DecodeConfig):
    """A chain of launches, a CTA per (lane, chunk) (C = `cfg.sample_chunks`) but the last (a CTA per lane), so C CTAs
    share each pass over a lane's row; a launch leaves its results for the next in the `scratch` buffers.

    Top-k launches n = 0..S (loop "topk"): launch n ends step n - 1 ("topk_total": the chunks' counts of its tries
    summed, packed `FIELD` bits a try in one uint64; "topk_carry": the threshold key with the step's digit, the number
    of tries whose count reached top_k; "topk_save": each chunk's copy in `kth`), then counts, for each try g of step
    n, the chunk's tokens whose key is at least the threshold with digit g + 1 ("topk_count"). Launch 0 also finds
    each chunk's largest logit and its first index ("chunk_max", "chunk_first", "chunk_out"); launch S the row's
    largest logit ("row_max", "max_save") and the chunk's candidates' weight ("topk_mass", "zk_out"). Top-p launches
    n = 0..S (loop "topp") do the same with weights ("topp_total", "topp_carry", "topp_save", "topp_mass": a try's mass
    sums the tokens at or above its key and the top-k threshold); launch 0 also sums the candidates' weight
    ("zk_total", "zk_carry", "zk_save"), launch S the chunk's kept weight ("kept_mass") and tokens after its last kept
    one ("last", "kept_out"). What only some launches do sits under an `if` on n (uniform across the grid: the other
    launches skip it, passes and allreduces alike). The last launch, a CTA a lane: the greedy token ("row_top",
    "row_first"), the kept weight ("z_total"), the larger threshold ("row_bounds"), the uniform number
    ("philox_carry", "philox_round"), the inverse CDF by bitwise search over the chunks ("chunk_carry",
    "chunk_below", "chunk_step": the last chunk at whose start the running sum of kept weight is at most `u z`;
    "chunk_base": that sum), then over that chunk's tokens ("cdf_carry", "cdf_mass", "cdf_step"), and "token" (the
    chunk's last kept token where rounding runs past it).

    A token's weight is `exp((logit - max) / temperature)`, float32, summed in float64 (a long tail of tiny weights
    added in float32 drifts by a token's worth); each sum is a fixed tree, so a draw is reproducible. A step's tries
    are monotone in their thresholds, so its digit is the number of tries that pass. Per-launch values are indexed by
    the launch (`[n, ...]`: no block reads what it writes, so schedules can bind the lane and chunk loops)."""
    B, V, C, S, G = cfg.batch, cfg.model.vocab_size, cfg.sample_chunks, STEPS, TRIES
    if V >= 2**FIELD:
        raise ValueError(f"vocab_size={V}: sample packs its counts in {FIELD} bits (at most {2**FIELD - 1} tokens)")
    L = -(-V // C)  # logits a chunk (the last one's `V - (C - 1) L`: 1 to L)
    CB, LB = C.bit_length(), L.bit_length()  # bits of a chunk start (0..C) and of a place in a chunk (0..L)
    R = ROUNDS
    NONE = T.max_value("int32")  # the min reducer's identity: no index found
    LOW = T.min_value("float32")  # the max reducer's

    def index(c, i):
        return c * L + i

    def logit(logits, b, c, i):
        """Logit `i` of lane b's chunk c, the row's last one past its end."""
        return logits[b, T.min(index(c, i), V - 1)]

    def drawing(temperature, b):
        return temperature[b] > T.float32(0)

    def k_search(temperature, top_k, b):
        return T.And(drawing(temperature, b), T.And(0 < top_k[b], top_k[b] < V))

    def p_search(temperature, top_p, b):
        return T.And(drawing(temperature, b), top_p[b] < T.float32(1))

    def with_digit(key, n, digit):
        """`key` with `digit` (uint32, 0..2^SEARCH_DIGIT_BITS - 1) at step `n` (most significant first)."""
        # `& (KEY_BITS - 1)` is no change where n < S, but keeps the shift's bounds non-negative for the analysis of
        # code where it cannot see that (a negative bound of a uint expression stops the build)
        shift = T.bitwise_and(KEY_BITS - SEARCH_DIGIT_BITS * (n + 1), KEY_BITS - 1)
        return T.bitwise_or(key, T.shift_left(digit, T.Cast("uint32", shift)))

    def tries_passed(total, b, c, n, bar):
        """Step `n`'s digit: how many of its tries' totals (`total[n, b, c, g]`) reach `bar`, as uint32."""
        passed = T.Select(total[n, b, c, 0] >= bar, T.uint32(1), T.uint32(0))
        for g in range(1, G):
            passed = passed + T.Select(total[n, b, c, g] >= bar, T.uint32(1), T.uint32(0))
        return passed

    def packed_tries(key, before, n):
        """Step `n`'s tries for one key: 1 in field g (bits `FIELD * g` on, uint64) where the key is at least the
        threshold `before` with digit g + 1, so one sum counts every try."""
        packed = T.uint64(0)
        for g in range(G):
            packed = packed + T.Select(
                key >= with_digit(before, n, T.uint32(g + 1)),
                T.shift_left(T.uint64(1), T.uint64(FIELD * g)),
                T.uint64(0),
            )
        return packed

    def counts_passed(total, bar):
        """A step's digit from its packed counts: how many tries' counts reach `bar`, as uint32."""
        passed = T.uint32(0)
        for g in range(G):
            count = T.bitwise_and(T.shift_right(total, T.uint64(FIELD * g)), T.uint64(2**FIELD - 1))
            passed = passed + T.Select(T.Cast("int64", count) >= T.Cast("int64", bar), T.uint32(1), T.uint32(0))
        return passed

    def weight(logits, vmax, temperature, b, c, i):
        return T.Cast("float64", T.exp((logit(logits, b, c, i) - vmax) / temperature[b]))

    def in_row(c, i):
        return index(c, i) < V

    def above(logits, b, c, i, threshold):
        """Token i of lane b's chunk c is a token of the row whose key is at least `threshold`."""
        return T.And(in_row(c, i), order_key(logit(logits, b, c, i)) >= threshold)

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
        chunk_max: T.Buffer((B, C), "float32"),
        chunk_first: T.Buffer((B, C), "int32"),
        counts: T.Buffer((B, S + 1, C), "uint64"),
        kth: T.Buffer((B, S + 1, C), "uint32"),
        zk_part: T.Buffer((B, C), "float64"),
        lane_max: T.Buffer((B, C), "float32"),
        masses: T.Buffer((B, S + 1, C, G), "float64"),
        pth: T.Buffer((B, S + 1, C), "uint32"),
        lane_zk: T.Buffer((B, C), "float64"),
        kept_part: T.Buffer((B, C), "float64"),
        kept_after: T.Buffer((B, C), "int32"),
    ):
        T.func_attr({"tirx.noalias": True})
        cmax = T.sblock_alloc_buffer((S + 1, B, C), "float32")
        cfirst = T.sblock_alloc_buffer((S + 1, B, C), "int32")
        ktot = T.sblock_alloc_buffer((S + 1, B, C), "uint64")
        kcur = T.sblock_alloc_buffer((S + 1, B, C), "uint32")
        rmax = T.sblock_alloc_buffer((S + 1, B, C), "float32")
        zsum = T.sblock_alloc_buffer((S + 1, B, C), "float64")
        zcur = T.sblock_alloc_buffer((S + 1, B, C), "float64")
        ptot = T.sblock_alloc_buffer((S + 1, B, C, G), "float64")
        pcur = T.sblock_alloc_buffer((S + 1, B, C), "uint32")
        ztot = T.sblock_alloc_buffer((S + 1, B, C), "float64")
        bound = T.sblock_alloc_buffer((S + 1, B, C), "uint32")  # the top-k threshold (launch S's)
        vmax = T.sblock_alloc_buffer((S + 1, B, C), "float32")  # the row's largest logit
        kmass = T.sblock_alloc_buffer((S + 1, B, C), "float64")
        kafter = T.sblock_alloc_buffer((S + 1, B, C), "int32")
        top = T.sblock_alloc_buffer((B,), "float32")
        first = T.sblock_alloc_buffer((B,), "int32")
        z = T.sblock_alloc_buffer((B,), "float64")
        threshold = T.sblock_alloc_buffer((B,), "uint32")  # the larger of the two
        cbase = T.sblock_alloc_buffer((B,), "float64")
        ctr = T.sblock_alloc_buffer((B, R, 4), "uint32")  # Philox counter before each round
        ctr_round = T.sblock_alloc_buffer((B, R, 4), "uint32")  # and after it
        chunk = T.sblock_alloc_buffer((B, CB), "int32")  # drawn chunk before each step
        chunk_step = T.sblock_alloc_buffer((B, CB), "int32")  # and after it
        base = T.sblock_alloc_buffer((B, CB), "float64")
        pos = T.sblock_alloc_buffer((B, LB), "int32")  # drawn place in that chunk before each step
        pos_step = T.sblock_alloc_buffer((B, LB), "int32")  # and after it
        below = T.sblock_alloc_buffer((B, LB), "float64")
        for n in range(S + 1):  # "topk"
            for b, c in T.grid(B, C):
                if n == 0:
                    for i in range(L):
                        with T.sblock("chunk_max"):
                            vn, vb, vc, vi = T.axis.remap("SSSR", [n, b, c, i])
                            with T.init():
                                cmax[vn, vb, vc] = LOW
                            cmax[vn, vb, vc] = T.max(cmax[vn, vb, vc], logit(logits, vb, vc, vi))
                    for i in range(L):
                        with T.sblock("chunk_first"):
                            vn, vb, vc, vi = T.axis.remap("SSSR", [n, b, c, i])
                            with T.init():
                                cfirst[vn, vb, vc] = NONE
                            cfirst[vn, vb, vc] = T.min(
                                cfirst[vn, vb, vc],
                                T.Select(logit(logits, vb, vc, vi) == cmax[vn, vb, vc], index(vc, vi), NONE),
                            )
                    with T.sblock("chunk_out"):
                        vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                        chunk_max[vb, vc] = T.Select(
                            cfirst[vn, vb, vc] == NONE, logits[vb, index(vc, 0)], cmax[vn, vb, vc]
                        )
                        chunk_first[vb, vc] = T.Select(cfirst[vn, vb, vc] == NONE, index(vc, 0), cfirst[vn, vb, vc])
                if 0 < n:
                    for j in range(C):
                        with T.sblock("topk_total"):
                            vn, vb, vc, vj = T.axis.remap("SSSR", [n, b, c, j])
                            with T.init():
                                ktot[vn, vb, vc] = T.uint64(0)
                            ktot[vn, vb, vc] = ktot[vn, vb, vc] + T.if_then_else(
                                k_search(temperature, top_k, vb), counts[vb, vn - 1, vj], T.uint64(0)
                            )
                with T.sblock("topk_carry"):
                    vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                    kcur[vn, vb, vc] = T.if_then_else(
                        vn == 0,
                        T.uint32(0),
                        with_digit(
                            kth[vb, T.max(vn - 1, 0), vc],
                            vn - 1,
                            counts_passed(ktot[vn, vb, vc], T.Select(0 < top_k[vb] and top_k[vb] < V, top_k[vb], V)),
                        ),
                    )
                with T.sblock("topk_save"):
                    vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                    kth[vb, vn, vc] = kcur[vn, vb, vc]
                if n < S:
                    for i in range(L):
                        with T.sblock("topk_count"):
                            vn, vb, vc, vi = T.axis.remap("SSSR", [n, b, c, i])
                            with T.init():
                                counts[vb, vn, vc] = T.uint64(0)
                            counts[vb, vn, vc] = counts[vb, vn, vc] + T.if_then_else(
                                T.And(k_search(temperature, top_k, vb), in_row(vc, vi)),
                                packed_tries(order_key(logit(logits, vb, vc, vi)), kcur[vn, vb, vc], vn),
                                T.uint64(0),
                            )
                if n == S:
                    for j in range(C):
                        with T.sblock("row_max"):
                            vn, vb, vc, vj = T.axis.remap("SSSR", [n, b, c, j])
                            with T.init():
                                rmax[vn, vb, vc] = LOW
                            rmax[vn, vb, vc] = T.max(rmax[vn, vb, vc], chunk_max[vb, vj])
                    with T.sblock("max_save"):
                        vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                        lane_max[vb, vc] = rmax[vn, vb, vc]
                    for i in range(L):
                        with T.sblock("topk_mass"):
                            vn, vb, vc, vi = T.axis.remap("SSSR", [n, b, c, i])
                            with T.init():
                                zsum[vn, vb, vc] = T.float64(0)
                            zsum[vn, vb, vc] = zsum[vn, vb, vc] + T.if_then_else(
                                T.And(p_search(temperature, top_p, vb), above(logits, vb, vc, vi, kcur[vn, vb, vc])),
                                weight(logits, rmax[vn, vb, vc], temperature, vb, vc, vi),
                                T.float64(0),
                            )
                    with T.sblock("zk_out"):
                        vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                        zk_part[vb, vc] = zsum[vn, vb, vc]
        for n in range(S + 1):  # "topp"
            for b, c in T.grid(B, C):
                if 0 < n:
                    for g, j in T.grid(G, C):
                        with T.sblock("topp_total"):
                            vn, vb, vc, vg, vj = T.axis.remap("SSSSR", [n, b, c, g, j])
                            with T.init():
                                ptot[vn, vb, vc, vg] = T.float64(0)
                            ptot[vn, vb, vc, vg] = ptot[vn, vb, vc, vg] + T.if_then_else(
                                p_search(temperature, top_p, vb),
                                masses[vb, vn - 1, vj, vg],
                                T.float64(0),
                            )
                if n == 0:
                    for j in range(C):
                        with T.sblock("zk_total"):
                            vn, vb, vc, vj = T.axis.remap("SSSR", [n, b, c, j])
                            with T.init():
                                ztot[vn, vb, vc] = T.float64(0)
                            ztot[vn, vb, vc] = ztot[vn, vb, vc] + zk_part[vb, vj]
                with T.sblock("zk_carry"):
                    vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                    zcur[vn, vb, vc] = T.if_then_else(vn == 0, ztot[vn, vb, vc], lane_zk[vb, vc])
                    bound[vn, vb, vc] = kth[vb, S, vc]
                    vmax[vn, vb, vc] = lane_max[vb, vc]
                if n == 0:
                    with T.sblock("zk_save"):
                        vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                        lane_zk[vb, vc] = zcur[vn, vb, vc]
                with T.sblock("topp_carry"):
                    vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                    pcur[vn, vb, vc] = T.if_then_else(
                        vn == 0,
                        T.uint32(0),
                        with_digit(
                            pth[vb, T.max(vn - 1, 0), vc],
                            vn - 1,
                            T.Select(
                                p_search(temperature, top_p, vb),
                                tries_passed(ptot, vb, vc, vn, T.Cast("float64", top_p[vb]) * zcur[vn, vb, vc]),
                                T.uint32(0),
                            ),
                        ),
                    )
                with T.sblock("topp_save"):
                    vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                    pth[vb, vn, vc] = pcur[vn, vb, vc]
                if n < S:
                    for g, i in T.grid(G, L):
                        with T.sblock("topp_mass"):
                            vn, vb, vc, vg, vi = T.axis.remap("SSSSR", [n, b, c, g, i])
                            with T.init():
                                masses[vb, vn, vc, vg] = T.float64(0)
                            masses[vb, vn, vc, vg] = masses[vb, vn, vc, vg] + T.if_then_else(
                                T.And(
                                    p_search(temperature, top_p, vb),
                                    above(
                                        logits,
                                        vb,
                                        vc,
                                        vi,
                                        T.max(
                                            with_digit(pcur[vn, vb, vc], vn, T.Cast("uint32", vg + 1)),
                                            bound[vn, vb, vc],
                                        ),
                                    ),
                                ),
                                weight(logits, vmax[vn, vb, vc], temperature, vb, vc, vi),
                                T.float64(0),
                            )
                if n == S:
                    for i in range(L):
                        with T.sblock("kept_mass"):
                            vn, vb, vc, vi = T.axis.remap("SSSR", [n, b, c, i])
                            with T.init():
                                kmass[vn, vb, vc] = T.float64(0)
                            kmass[vn, vb, vc] = kmass[vn, vb, vc] + T.if_then_else(
                                T.And(
                                    drawing(temperature, vb),
                                    above(logits, vb, vc, vi, T.max(pcur[vn, vb, vc], bound[vn, vb, vc])),
                                ),
                                weight(logits, vmax[vn, vb, vc], temperature, vb, vc, vi),
                                T.float64(0),
                            )
                    for i in range(L):
                        # as tokens after the last kept one: CUDA C++ reads -2147483648 as a long
                        with T.sblock("last"):
                            vn, vb, vc, vi = T.axis.remap("SSSR", [n, b, c, i])
                            with T.init():
                                kafter[vn, vb, vc] = NONE
                            kafter[vn, vb, vc] = T.min(
                                kafter[vn, vb, vc],
                                T.if_then_else(
                                    T.And(
                                        drawing(temperature, vb),
                                        above(logits, vb, vc, vi, T.max(pcur[vn, vb, vc], bound[vn, vb, vc])),
                                    ),
                                    V - 1 - index(vc, vi),
                                    NONE,
                                ),
                            )
                    with T.sblock("kept_out"):
                        vn, vb, vc = T.axis.remap("SSS", [n, b, c])
                        kept_part[vb, vc] = kmass[vn, vb, vc]
                        kept_after[vb, vc] = kafter[vn, vb, vc]
        for b in range(B):
            for j in range(C):
                with T.sblock("row_top"):
                    vb, vj = T.axis.remap("SR", [b, j])
                    with T.init():
                        top[vb] = LOW
                    top[vb] = T.max(top[vb], chunk_max[vb, vj])
            for j in range(C):
                with T.sblock("row_first"):
                    vb, vj = T.axis.remap("SR", [b, j])
                    with T.init():
                        first[vb] = NONE
                    first[vb] = T.min(first[vb], T.Select(chunk_max[vb, vj] == top[vb], chunk_first[vb, vj], NONE))
            for j in range(C):
                with T.sblock("z_total"):
                    vb, vj = T.axis.remap("SR", [b, j])
                    with T.init():
                        z[vb] = T.float64(0)
                    z[vb] = z[vb] + kept_part[vb, vj]
            with T.sblock("row_bounds"):
                vb = T.axis.spatial(B, b)
                threshold[vb] = T.max(kth[vb, S, 0], pth[vb, S, 0])
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
            for m in range(CB):
                with T.sblock("chunk_carry"):
                    vb, vm = T.axis.remap("SS", [b, m])
                    chunk[vb, vm] = T.Select(vm == 0, 0, chunk_step[vb, T.max(vm - 1, 0)])
                for j in range(C):
                    with T.sblock("chunk_below"):
                        vb, vm, vj = T.axis.remap("SSR", [b, m, j])
                        with T.init():
                            base[vb, vm] = T.float64(0)
                        base[vb, vm] = base[vb, vm] + T.if_then_else(
                            vj < chunk[vb, vm] + (1 << (CB - 1 - vm)), kept_part[vb, vj], T.float64(0)
                        )
                with T.sblock("chunk_step"):
                    vb, vm = T.axis.remap("SS", [b, m])
                    chunk_step[vb, vm] = T.Select(
                        chunk[vb, vm] + (1 << (CB - 1 - vm)) < C and base[vb, vm] <= drawn_below(ctr_round, z, vb),
                        chunk[vb, vm] + (1 << (CB - 1 - vm)),
                        chunk[vb, vm],
                    )
            for j in range(C):
                with T.sblock("chunk_base"):
                    vb, vj = T.axis.remap("SR", [b, j])
                    with T.init():
                        cbase[vb] = T.float64(0)
                    cbase[vb] = cbase[vb] + T.if_then_else(vj < chunk_step[vb, CB - 1], kept_part[vb, vj], T.float64(0))
            for m in range(LB):
                with T.sblock("cdf_carry"):
                    vb, vm = T.axis.remap("SS", [b, m])
                    pos[vb, vm] = T.Select(vm == 0, 0, pos_step[vb, T.max(vm - 1, 0)])
                for i in range(L):
                    with T.sblock("cdf_mass"):
                        vb, vm, vi = T.axis.remap("SSR", [b, m, i])
                        with T.init():
                            below[vb, vm] = T.float64(0)
                        below[vb, vm] = below[vb, vm] + T.if_then_else(
                            T.And(
                                T.And(vi < pos[vb, vm] + (1 << (LB - 1 - vm)), drawing(temperature, vb)),
                                above(logits, vb, chunk_step[vb, CB - 1], vi, threshold[vb]),
                            ),
                            weight(logits, top[vb], temperature, vb, chunk_step[vb, CB - 1], vi),
                            T.float64(0),
                        )
                with T.sblock("cdf_step"):
                    vb, vm = T.axis.remap("SS", [b, m])
                    pos_step[vb, vm] = T.Select(
                        pos[vb, vm] + (1 << (LB - 1 - vm)) <= L
                        and cbase[vb] + below[vb, vm] <= drawn_below(ctr_round, z, vb),
                        pos[vb, vm] + (1 << (LB - 1 - vm)),
                        pos[vb, vm],
                    )
            with T.sblock("token"):
                vb = T.axis.spatial(B, b)
                tokens[vb] = T.Select(
                    drawing(temperature, vb),
                    T.Select(
                        T.And(pos_step[vb, LB - 1] < L, index(chunk_step[vb, CB - 1], pos_step[vb, LB - 1]) < V),
                        index(chunk_step[vb, CB - 1], pos_step[vb, LB - 1]),
                        V - 1 - kept_after[vb, chunk_step[vb, CB - 1]],
                    ),
                    first[vb],
                )

    return sample
