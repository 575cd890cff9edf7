"""advance: the end of a model step on the device: each active lane's next input token, position and sampling counter,
and its finish, so that consecutive steps need nothing from the host.

Per lane with `slots[b] >= 0`, having just run position `p = positions[b]`: the next position is `p + 1`; while it
is still inside the lane's prompt (`p + 1 < prompt_lens[b]`) the next token is the prompt's (`prompts[b, p + 1]`),
otherwise the sampled one, which the lane emits. An emitted token finishes the lane when it is one of `stop_ids`
(EOS; -1 pads the list) or its position reaches `limits[b]` (the last position the lane may emit: its token budget
or the cache's end): the lane's slot becomes -1, so later steps leave its states alone, and its position and step stay
where they were. A lane with a negative slot changes nothing and emits nothing; its next token is 0.

`events[0, b]` is the token lane b emitted at this step (-1: none) and `events[1, b]` is 1 where it finished: the one
buffer the host reads back.
"""

from __future__ import annotations

import functools

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import STOP_IDS, DecodeConfig
from gdn_tvm.signature import Arg


def _steps(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 2**62, shape, dtype=np.int64)


def signature(cfg: DecodeConfig) -> list[Arg]:
    """sampled: [B] int32 (the sampler's tokens); prompts: [B, max_len] int32; prompt_lens, limits: [B] int32 in
    [1, max_len]; stop_ids: [STOP_IDS] int32 (-1 pads); positions, slots: [B] int32 and steps: [B] int64, updated in
    place -> ids: [B] int32 (the next step's tokens), events: [2, B] int32."""
    B, S, L, V = cfg.batch, cfg.slots, cfg.max_len, cfg.model.vocab_size
    return [
        Arg("sampled", (B,), "int32", role="index", bound=(0, V)),
        Arg("prompts", (B, L), "int32", role="index", bound=(0, V)),
        Arg("prompt_lens", (B,), "int32", role="index", bound=(1, L + 1)),
        Arg("limits", (B,), "int32", role="index", bound=(1, L + 1)),
        Arg("stop_ids", (STOP_IDS,), "int32", role="index", bound=(-1, V)),
        Arg("positions", (B,), "int32", role="index", bound=(0, L)),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("steps", (B,), "int64", role="state", sample=_steps),
        Arg("ids", (B,), "int32", role="out"),
        Arg("events", (2, B), "int32", role="out"),
        Arg("positions_out", (B,), "int32", role="state", alias="positions"),
        Arg("slots_out", (B,), "int32", role="state", alias="slots"),
        Arg("steps_out", (B,), "int64", role="state", alias="steps"),
    ]


def make_advance(cfg: DecodeConfig):
    """Block "advance": one lane. Position, slot and step are updated in place, each by the lane's own thread: the slot
    is written first (from the old position), then position and step (from the new slot)."""
    B, L = cfg.batch, cfg.max_len

    @T.prim_func(s_tir=True)
    def advance(
        sampled: T.Buffer((B,), "int32"),
        prompts: T.Buffer((B, L), "int32"),
        prompt_lens: T.Buffer((B,), "int32"),
        limits: T.Buffer((B,), "int32"),
        stop_ids: T.Buffer((STOP_IDS,), "int32"),
        positions: T.Buffer((B,), "int32"),
        slots: T.Buffer((B,), "int32"),
        steps: T.Buffer((B,), "int64"),
        ids: T.Buffer((B,), "int32"),
        events: T.Buffer((2, B), "int32"),
        positions_out: T.Buffer((B,), "int32"),
        slots_out: T.Buffer((B,), "int32"),
        steps_out: T.Buffer((B,), "int64"),
    ):
        for b in T.serial(B):
            with T.sblock("advance"):
                vb = T.axis.spatial(B, b)
                ids[vb] = _token(vb, sampled, prompts, prompt_lens, positions, slots)
                events[0, vb] = T.Select(
                    _emit(vb, prompt_lens, positions, slots),
                    _token(vb, sampled, prompts, prompt_lens, positions, slots),
                    -1,
                )
                events[1, vb] = T.Cast(
                    "int32", _done(vb, sampled, prompts, prompt_lens, positions, slots, limits, stop_ids)
                )
                slots_out[vb] = T.Select(
                    _done(vb, sampled, prompts, prompt_lens, positions, slots, limits, stop_ids), -1, slots[vb]
                )
                positions_out[vb] = T.Select(slots[vb] >= 0, positions[vb] + 1, positions[vb])  # the new slot
                steps_out[vb] = T.Select(slots[vb] >= 0, steps[vb] + T.int64(1), steps[vb])

    return advance


# Lane b's expressions, rebuilt where each is used: a name bound in a prim_func body is a let, which the block's
# inferred read regions cannot see.


def _emit(b, prompt_lens, positions, slots):
    """Lane b is active and its next position is past its prompt: it emits the sampled token."""
    return T.And(slots[b] >= 0, positions[b] + 1 >= prompt_lens[b])


def _token(b, sampled, prompts, prompt_lens, positions, slots):
    """Lane b's next input token: sampled, the prompt's next, or 0 for an inactive lane."""
    forced = prompts[b, T.min(positions[b] + 1, prompts.shape[1] - 1)]
    return T.Select(_emit(b, prompt_lens, positions, slots), sampled[b], T.Select(slots[b] >= 0, forced, 0))


def _done(b, sampled, prompts, prompt_lens, positions, slots, limits, stop_ids):
    """Lane b emits a stop token or reaches its limit."""
    token = _token(b, sampled, prompts, prompt_lens, positions, slots)
    stop = functools.reduce(T.Or, [token == stop_ids[e] for e in range(STOP_IDS)])
    return T.And(_emit(b, prompt_lens, positions, slots), T.Or(stop, positions[b] + 1 >= limits[b]))
