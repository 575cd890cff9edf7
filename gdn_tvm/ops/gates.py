"""gates: per value head, the log-decay `g` and the write strength `beta` of the delta rule."""

from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

from gdn_tvm.config import DecodeConfig
from gdn_tvm.signature import Arg


def sample_negative(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """`A = -exp(A_log)`: strictly negative."""
    return -np.exp(0.5 * rng.standard_normal(shape)).astype(np.float32)


def sample_wide(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Wide enough that `a + dt_bias` takes both softplus branches (threshold 20)."""
    return rng.uniform(-20.0, 40.0, shape).astype(np.float32)


def signature(cfg: DecodeConfig) -> list[Arg]:
    """a, b: [B, Hv]; A, dt_bias: [Hv] -> g, beta: [B, Hv] float32."""
    bh, hv = (cfg.batch, cfg.model.n_v_heads), (cfg.model.n_v_heads,)
    return [
        Arg("a", bh, sample=sample_wide),
        Arg("b", bh),
        Arg("A", hv, role="weight", sample=sample_negative),
        Arg("dt_bias", hv, role="weight"),
        Arg("g", bh, role="out"),
        Arg("beta", bh, role="out"),
    ]


def log_decay(a, dt_bias, A):
    """`g = softplus(a + dt_bias) * A`, softplus(x) = x above 20 (docs/math.md step 5): a TIR expression."""
    x = a + dt_bias
    return A * T.if_then_else(x > T.float32(20), x, T.log1p(T.exp(x)))


def write_strength(b):
    """`beta = sigmoid(b)`: a TIR expression."""
    return T.float32(1) / (T.float32(1) + T.exp(-b))


def make_gates(cfg: DecodeConfig):
    """`g = softplus(a + dt_bias) * A` (softplus(x) = x above 20), `beta = sigmoid(b)`; block "gates"."""
    B, H = cfg.batch, cfg.model.n_v_heads

    @T.prim_func(s_tir=True)
    def gates(
        a: T.Buffer((B, H), "float32"),
        b: T.Buffer((B, H), "float32"),
        A: T.Buffer((H,), "float32"),
        dt_bias: T.Buffer((H,), "float32"),
        g: T.Buffer((B, H), "float32"),
        beta: T.Buffer((B, H), "float32"),
    ):
        T.func_attr({"tirx.noalias": True})
        for i, h in T.grid(B, H):
            with T.sblock("gates"):
                vi, vh = T.axis.remap("SS", [i, h])
                g[vi, vh] = log_decay(a[vi, vh], dt_bias[vh], A[vh])
                beta[vi, vh] = write_strength(b[vi, vh])

    return gates
