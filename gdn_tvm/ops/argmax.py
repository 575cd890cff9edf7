"""argmax: each lane's greedy token, the first index of its largest logit: the sampler of a model that decodes
greedily (`plan.model(..., sampling=False)`), two passes over the row where `sample` makes about 85.

Blocks "max" and "argmax" are `sample`'s own first two passes (`greedy_passes`), so the two ops pick the same token.
"""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def peaked_logits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Logits spread like a trained model's (a few tokens carry most of the probability)."""
    return (4.0 * rng.standard_normal(shape)).astype(np.float32)


def signature(cfg: DecodeConfig) -> list[Arg]:
    """logits: [B, V] float32 (finite) -> tokens: [B] int32."""
    B, V = cfg.batch, cfg.model.vocab_size
    return [Arg("logits", (B, V), sample=peaked_logits), Arg("tokens", (B,), "int32", role="out")]


def greedy_passes(logits, vmax, first, b, V: int) -> None:
    """Blocks "max" (`vmax[b]`, the lane's largest logit) and "argmax" (`first[b]`, the first index holding it),
    expanded in the calling prim_func body under its lane loop `b`."""

    @T.macro
    def passes():
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

    passes()


def make_argmax(cfg: DecodeConfig):
    """Blocks "max", "argmax" (per lane, `greedy_passes`) and "token"."""
    B, V = cfg.batch, cfg.model.vocab_size

    @T.prim_func(s_tir=True)
    def argmax(logits: T.Buffer((B, V), "float32"), tokens: T.Buffer((B,), "int32")):
        T.func_attr({"tirx.noalias": True})
        vmax = T.sblock_alloc_buffer((B,), "float32")
        first = T.sblock_alloc_buffer((B,), "int32")
        for b in range(B):
            greedy_passes(logits, vmax, first, b, V)
            with T.sblock("token"):
                vb = T.axis.spatial(B, b)
                tokens[vb] = first[vb]

    return argmax
