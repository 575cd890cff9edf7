"""advance: lanes walked through their prompts and budgets by the kernel (llvm and the emulated CUDA kernel), step
after step with its own outputs fed back, against a plain host model of a request's life."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CASES
from cuda_emu import emulated, lower

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import STOP_IDS
from gdn_tvm.registry import OPS
from gdn_tvm.target import llvm

OP = OPS["advance"]
CFG = CASES["4b-B3"].replace(batch=4, slots=6, max_len=12)
EOS = 5


def _kernel(target: str):
    if target == "llvm":
        return compile_op(OP, CFG, llvm())
    return emulated(OP, CFG, *lower(OP.schedule(CFG, "cuda").mod))


def _expected_life(prompt: list[int], budget: int, sampled: np.ndarray) -> tuple[list[int], list[int]]:
    """A request's next inputs and emitted tokens, step by step, until it finishes: the prompt fed token by token,
    then sampled tokens (sampled[t] at step t) until EOS, `budget` tokens or the cache's end."""
    inputs, emitted = [], []
    for t in range(len(sampled)):
        nxt = t + 1
        if nxt < len(prompt):
            inputs.append(prompt[nxt])
            continue
        token = int(sampled[t])
        inputs.append(token)
        emitted.append(token)
        if token == EOS or len(emitted) == budget or nxt == CFG.max_len:
            break
    return inputs, emitted


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_lanes_live_through_prompt_budget_eos_and_cache_end(target, rng):
    """Four lanes (one idle) on scattered slots, fed their own outputs: each takes its prompt, emits until EOS, its
    budget or the cache's end, then keeps slot -1, position and step; the events say exactly what was emitted."""
    kernel, B, L = _kernel(target), CFG.batch, CFG.max_len
    prompts = [[7, 8, 9], [3], [1, 2, 3, 4, 6, 7, 8, 9, 1, 2], None]  # lane 2's prompt runs into the cache's end
    budgets = [4, 20, 20, 0]
    sampled_all = rng.integers(6, 50, (L + 2, B)).astype(np.int32)  # never EOS, but at one chosen step of lane 1
    sampled_all[6, 1] = EOS
    slots0 = np.array([4, 0, 5, -1], np.int32)
    state = {
        "prompts": np.zeros((B, L), np.int32),
        "prompt_lens": np.array([len(p) if p else 1 for p in prompts], np.int32),
        "limits": np.array(
            [min(len(p) + n - 1, L) if p else 1 for p, n in zip(prompts, budgets, strict=True)], np.int32
        ),
        "stop_ids": np.array([EOS] + [-1] * (STOP_IDS - 1), np.int32),
        "positions": np.zeros(B, np.int32),
        "slots": slots0.copy(),
        "steps": np.array([0, 10, 2**40, 3], np.int64),
    }
    for b, p in enumerate(prompts):
        if p:
            state["prompts"][b, : len(p)] = p
    inputs, emitted, finished = [[] for _ in range(B)], [[] for _ in range(B)], [None] * B
    for t in range(L + 2):
        out = {"ids": np.full(B, -7, np.int32), "events": np.full((2, B), -7, np.int32)}
        kernel(sampled=sampled_all[t], **state, **out)
        for b in range(B):
            if slots0[b] >= 0 and finished[b] is None:
                inputs[b].append(int(out["ids"][b]))
                if out["events"][0, b] >= 0:
                    emitted[b].append(int(out["events"][0, b]))
                if out["events"][1, b]:
                    finished[b] = t
            else:  # idle or finished: nothing emitted, next token 0
                assert out["ids"][b] == 0 and tuple(out["events"][:, b]) == (-1, 0), f"lane {b} at step {t}"
    for b, prompt in enumerate(prompts[:3]):
        want_inputs, want_emitted = _expected_life(prompt, budgets[b], sampled_all[:, b])
        assert inputs[b] == want_inputs and emitted[b] == want_emitted, f"lane {b}"
        assert finished[b] == len(want_inputs) - 1, f"lane {b} finished at step {finished[b]}"
        assert state["slots"][b] == -1 and state["positions"][b] == finished[b]
    assert emitted[1][-1] == EOS and len(emitted[0]) == 4 and len(emitted[2]) == 3  # EOS, budget, cache end
    assert state["steps"].tolist() == [finished[0], 10 + finished[1], 2**40 + finished[2], 3]
    assert state["slots"][3] == -1 and state["positions"][3] == 0
