"""advance reference."""

import numpy as np


def advance(
    sampled: np.ndarray,
    prompts: np.ndarray,
    prompt_lens: np.ndarray,
    limits: np.ndarray,
    stop_ids: np.ndarray,
    positions: np.ndarray,
    slots: np.ndarray,
    steps: np.ndarray,
    ids: np.ndarray,
    events: np.ndarray,
) -> None:
    """Per ops/advance.py: positions, slots, steps [B] updated in place; ids[:] (next tokens [B]) and events[:] ([2, B]:
    the emitted token or -1, the finished flag) written."""
    for b in range(len(slots)):
        ids[b], events[:, b] = 0, (-1, 0)
        if slots[b] < 0:
            continue
        nxt = positions[b] + 1
        emit = nxt >= prompt_lens[b]
        token = sampled[b] if emit else prompts[b, min(nxt, prompts.shape[1] - 1)]
        done = emit and (token in stop_ids or nxt >= limits[b])
        ids[b] = token
        events[:, b] = (token if emit else -1, int(done))
        if done:
            slots[b] = -1
        else:
            positions[b], steps[b] = nxt, steps[b] + 1
