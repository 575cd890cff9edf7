"""gemv: `y = x @ w.T`, the projections around every mixer (PyTorch `Linear` layout, no bias)."""

from __future__ import annotations

from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def signature(cfg: DecodeConfig, proj: str) -> list[Arg]:
    """w: [N, K] float32 (out, in), x: [B, K] float32 -> y: [B, N] float32; (N, K) = projections[proj]."""
    n, k = cfg.model.projections[proj]
    return [Arg("w", (n, k), role="weight"), Arg("x", (cfg.batch, k)), Arg("y", (cfg.batch, n), role="out")]


def make_gemv(cfg: DecodeConfig, proj: str):
    B = cfg.batch
    N, K = cfg.model.projections[proj]

    @T.prim_func(s_tir=True)
    def gemv(w: T.Buffer((N, K), "float32"), x: T.Buffer((B, K), "float32"), y: T.Buffer((B, N), "float32")):
        T.func_attr({"tirx.noalias": True})
        for b, n, k in T.grid(B, N, K):
            with T.sblock("gemv"):
                vb, vn, vk = T.axis.remap("SSR", [b, n, k])
                with T.init():
                    y[vb, vn] = T.float32(0)
                y[vb, vn] = y[vb, vn] + x[vb, vk] * w[vn, vk]

    return gemv
