"""argmax: each lane's greedy token, the first index of its largest logit (`np.argmax`, and the token `sample` picks
for a greedy lane): the sampler of a model that decodes greedily (`plan.model(..., sampling=False)`).

One launch, many CTAs a lane's row: per (lane, chunk) the chunk's largest logit and the row index of its first
occurrence (the row cut into `cfg.argmax_chunks` chunks: 256 of 970 logits at V = 248,320), written to `chunk_max`
and `chunk_first`; then the chunk that finishes last (`common.arrive` at the lane's `arrivals` counter) takes the
largest chunk max and the smallest first index among the chunks holding it, which is the row's first largest.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import arrive
from gdn_tvm.signature import Arg, peaked_logits


def signature(cfg: DecodeConfig) -> list[Arg]:
    """logits: [B, V] float32 (no NaN) -> chunk_max: [B, C] float32, chunk_first: [B, C] int32 (the per-chunk
    results, each chunk's largest logit and the row index of its first occurrence), tokens: [B] int32; arrivals: [B]
    int32, the lanes' arrival counters (zero before and after)."""
    B, V, C = cfg.batch, cfg.model.vocab_size, cfg.argmax_chunks
    return [
        Arg("logits", (B, V), sample=peaked_logits),
        Arg("chunk_max", (B, C), role="out"),
        Arg("chunk_first", (B, C), "int32", role="out"),
        Arg("tokens", (B,), "int32", role="out"),
        Arg("arrivals", (B,), "int32", role="counter"),
    ]


def make_argmax(cfg: DecodeConfig):
    """Per (lane, chunk): blocks "chunk_max" (the chunk's largest logit), "chunk_first" (the row index of its first
    occurrence), "chunk_out" (both out to `chunk_max`, `chunk_first`) and "arrive" (the chunk's ticket); in the
    chunk drawing the last: "row_max" (the largest chunk max), "row_first" (the smallest first index among the chunks
    holding it) and "token" (which also sets the lane's counter back to zero).

    The last chunk reads the row's last logit again in place of those past V (its max and first index stay). A max
    starts at the lowest finite float32 (TVM's cross-thread reductions take only their reducers' own identities,
    `T.min_value`), which every logit but -inf reaches; where none does (all -inf) the index pass finds none
    (`T.max_value`), and "chunk_out" / "token" take the first index and its -inf, as `np.argmax` does."""
    B, V, C = cfg.batch, cfg.model.vocab_size, cfg.argmax_chunks
    L = -(-V // C)  # logits a chunk (the last one's `V - (C - 1) L`: 1 to L)
    NONE = T.max_value("int32")  # the min reducer's identity: no index found

    def logit(logits, b, c, i):
        """Logit `i` of lane b's chunk c, the row's last one past its end."""
        return logits[b, T.min(c * L + i, V - 1)]

    @T.prim_func(s_tir=True)
    def argmax(
        logits: T.Buffer((B, V), "float32"),
        chunk_max: T.Buffer((B, C), "float32"),
        chunk_first: T.Buffer((B, C), "int32"),
        tokens: T.Buffer((B,), "int32"),
        arrivals: T.Buffer((B,), "int32"),
    ):
        T.func_attr({"tirx.noalias": True})
        cmax = T.sblock_alloc_buffer((B, C), "float32")
        cfirst = T.sblock_alloc_buffer((B, C), "int32")
        ticket = T.sblock_alloc_buffer((B, C), "int32")
        rmax = T.sblock_alloc_buffer((B, C), "float32")
        rfirst = T.sblock_alloc_buffer((B, C), "int32")
        for b, c in T.grid(B, C):
            for i in range(L):
                with T.sblock("chunk_max"):
                    vb, vc, vi = T.axis.remap("SSR", [b, c, i])
                    with T.init():
                        cmax[vb, vc] = T.min_value("float32")
                    cmax[vb, vc] = T.max(cmax[vb, vc], logit(logits, vb, vc, vi))
            for i in range(L):
                with T.sblock("chunk_first"):
                    vb, vc, vi = T.axis.remap("SSR", [b, c, i])
                    with T.init():
                        cfirst[vb, vc] = NONE
                    cfirst[vb, vc] = T.min(
                        cfirst[vb, vc], T.Select(logit(logits, vb, vc, vi) == cmax[vb, vc], vc * L + vi, NONE)
                    )
            with T.sblock("chunk_out"):
                vb, vc = T.axis.remap("SS", [b, c])
                chunk_max[vb, vc] = T.Select(cfirst[vb, vc] == NONE, logits[vb, vc * L], cmax[vb, vc])
                chunk_first[vb, vc] = T.Select(cfirst[vb, vc] == NONE, vc * L, cfirst[vb, vc])
            with T.sblock("arrive"):
                vb, vc = T.axis.remap("SS", [b, c])
                ticket[vb, vc] = arrive(arrivals[vb], vc)
            if ticket[b, c] == C - 1:
                for j in range(C):
                    with T.sblock("row_max"):
                        vb, vc, vj = T.axis.remap("SSR", [b, c, j])
                        with T.init():
                            rmax[vb, vc] = T.min_value("float32")
                        rmax[vb, vc] = T.max(rmax[vb, vc], chunk_max[vb, vj])
                for j in range(C):
                    with T.sblock("row_first"):
                        vb, vc, vj = T.axis.remap("SSR", [b, c, j])
                        with T.init():
                            rfirst[vb, vc] = NONE
                        rfirst[vb, vc] = T.min(
                            rfirst[vb, vc], T.Select(chunk_max[vb, vj] == rmax[vb, vc], chunk_first[vb, vj], NONE)
                        )
                with T.sblock("token"):
                    vb, vc = T.axis.remap("SS", [b, c])
                    tokens[vb] = T.Select(rfirst[vb, vc] == NONE, 0, rfirst[vb, vc])
                    arrivals[vb] = 0

    return argmax
