"""kv_row_scatter: append this step's k and v rows to the KV caches of each lane's slot (pure data movement).

`k_cache[slots[b], positions[b]] = k[b]`, `v_cache[slots[b], positions[b]] = v[b]`, the positions read on the
device. A lane with `slots[b] == -1` writes nothing. The caches are only written here, so they need no alias
parameters. Caches of kv_dtype bf16 take each row rounded to the nearest even bf16.
"""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.ops.common import narrowed
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig) -> list[Arg]:
    """k, v: [B, Hkv, D] float32; k_cache, v_cache: [S, max_len, Hkv, D] kv_dtype (written in place);
    slots: [B] int32 (-1 skips the lane); positions: [B] int32."""
    B, S, L = cfg.batch, cfg.slots, cfg.max_len
    Hkv, D = cfg.model.n_kv_heads, cfg.model.head_dim
    return [
        Arg("k", (B, Hkv, D)),
        Arg("v", (B, Hkv, D)),
        Arg("k_cache", (S, L, Hkv, D), cfg.kv_dtype, role="state"),
        Arg("v_cache", (S, L, Hkv, D), cfg.kv_dtype, role="state"),
        Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        Arg("positions", (B,), "int32", role="index", bound=(0, L)),
    ]


def make_kv_row_scatter(cfg: DecodeConfig):
    B, S, L = cfg.batch, cfg.slots, cfg.max_len
    Hkv, D, KV = cfg.model.n_kv_heads, cfg.model.head_dim, cfg.kv_dtype
    cache = tuple(T.int64(n) for n in (S, L, Hkv, D))  # int64 indexing: S * max_len * Hkv * D may exceed 2^31

    @T.prim_func(s_tir=True)
    def kv_row_scatter(
        k: T.Buffer((B, Hkv, D), "float32"),
        v: T.Buffer((B, Hkv, D), "float32"),
        k_cache: T.Buffer(cache, KV),
        v_cache: T.Buffer(cache, KV),
        slots: T.Buffer((B,), "int32"),
        positions: T.Buffer((B,), "int32"),
    ):
        T.func_attr({"tirx.noalias": True})
        for b, h, d in T.grid(B, Hkv, D):
            with T.sblock("scatter"):
                vb, vh, vd = T.axis.remap("SSS", [b, h, d])
                if slots[vb] >= 0:
                    k_cache[slots[vb], positions[vb], vh, vd] = narrowed(k[vb, vh, vd], KV)
                    v_cache[slots[vb], positions[vb], vh, vd] = narrowed(v[vb, vh, vd], KV)

    return kv_row_scatter
