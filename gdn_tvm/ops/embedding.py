"""embedding: the rows of the token embedding table for each lane's token id (pure data movement: a bf16 table's
rows are widened to float32, which is exact).

An id outside `[0, vocab_size)` reads nothing and yields a zero row: the checked entry point refuses such an id by
name first, but a replayed CUDA graph reads ids from device memory unchecked, and its kernel must stay in bounds.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import widened
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """ids: int32 [B] in [0, V); table: [V, hidden] weight_dtype -> rows: [B, hidden] float32
    (`rows[b] = table[ids[b]]`)."""
    B, V, H = cfg.batch, cfg.model.vocab_size, cfg.model.hidden
    return [
        Arg("ids", (B,), "int32", role="index", bound=(0, V)),
        Arg("table", (V, H), cfg.weight_dtype, role="weight"),
        Arg("rows", (B, H), role="out"),
    ]


def make_embedding(cfg: DecodeConfig):
    """Block "lookup": one element of a row; the clamped index keeps the load in bounds for any id."""
    B, V, H, W = cfg.batch, cfg.model.vocab_size, cfg.model.hidden, cfg.weight_dtype

    @T.prim_func(s_tir=True)
    def embedding(ids: T.Buffer((B,), "int32"), table: T.Buffer((V, H), W), rows: T.Buffer((B, H), "float32")):
        T.func_attr({"tirx.noalias": True})
        for b, h in T.grid(B, H):
            with T.sblock("lookup"):
                vb, vh = T.axis.remap("SS", [b, h])
                rows[vb, vh] = T.if_then_else(
                    0 <= ids[vb] and ids[vb] < V, widened(table[T.max(T.min(ids[vb], V - 1), 0), vh]), T.float32(0)
                )

    return embedding
