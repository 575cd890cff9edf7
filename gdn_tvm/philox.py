"""Philox-4x32-10, the counter-based random number generator of `sample` (Salmon, Moraes, Dror, Shaw: "Parallel
random numbers: as easy as 1, 2, 3", SC'11; Random123's `philox4x32`, cuRAND's Philox4_32_10): its constants, and a
plain-Python implementation that the sampling reference uses and tests/test_sample.py checks against the published
known-answer vectors. A lane's number depends only on its (seed, step), so a step reproduces exactly, eagerly or
replayed in a graph."""

from __future__ import annotations

ROUNDS = 10
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)
KEY_STEPS = (0x9E3779B9, 0xBB67AE85)  # added to the key after each round (a Weyl sequence)
UNIFORM_BITS = 24  # bits of a uniform number: exact in float32
MASK = 0xFFFFFFFF


def philox4x32(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    """The four 32-bit output words for four 32-bit counter words and two 32-bit key words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(ROUNDS):
        p0, p1 = MULTIPLIERS[0] * c0, MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
        k0, k1 = (k0 + KEY_STEPS[0]) & MASK, (k1 + KEY_STEPS[1]) & MASK
    return c0, c1, c2, c3


def uniform(seed: int, step: int) -> float:
    """A lane's number in [0, 1): the top `UNIFORM_BITS` bits of the first output word at key `seed` and counter
    `(step, 0)`, each 64-bit value (taken modulo 2^64) split into its low and high 32-bit words."""
    s, t = int(seed) % 2**64, int(step) % 2**64
    word = philox4x32((t & MASK, t >> 32, 0, 0), (s & MASK, s >> 32))[0]
    return (word >> (32 - UNIFORM_BITS)) * 2.0**-UNIFORM_BITS
