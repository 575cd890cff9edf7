"""Layer executors: one decode step of a mixer as a fixed launch plan over compiled kernels.

A layer allocates its activations once, binds every kernel's arguments at construction, and each
step replays that list: no shape logic and no allocation in the step loop. State pools (conv and
recurrent states, KV caches) are `[slots, ...]` device tensors indexed by the step's slot ids.
The per-step inputs (x, slots, positions) live in a shared `StepBuffers`, written before the plan
runs, so the same plan (or a CUDA graph captured from it) serves every position.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import tvm

from gdn_tvm.config import DecodeConfig
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.runtime.weights import check_weights, upload
from gdn_tvm.signature import ArgumentError, bind, check_args

Kernels = Mapping[str, Kernel]


class StepBuffers:
    """Device inputs of one step: `slots` [B] (initially all -1: no lane active) and `positions` [B] int32."""

    def __init__(self, cfg: DecodeConfig, device: tvm.runtime.Device):
        self.slots = tvm.runtime.tensor(np.full(cfg.batch, -1, np.int32), device)
        self.positions = tvm.runtime.tensor(np.zeros(cfg.batch, np.int32), device)


def _zeros(shape: tuple[int, ...], device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    return tvm.runtime.tensor(np.zeros(shape, np.float32), device)


def _view(t: tvm.runtime.Tensor, *shape: int) -> tvm.runtime.Tensor:
    return t._create_view(shape)


class _Layer:
    """A mixer layer: `x` [B, hidden] in, `out` [B, hidden] out, a launch plan between them."""

    kind = ""

    def __init__(self, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor):
        check_weights(cfg.model, self.kind, weights)
        self.cfg = cfg
        self.device = x.device
        self.io = io
        self.x = x
        self.out = tvm.runtime.empty((cfg.batch, cfg.model.hidden), "float32", self.device)
        self.weights = upload(weights, self.device)
        self.plan: list[tuple[Callable, list]] = []
        self.launched: list[str] = []  # the plan's kernel names, in order
        self.states: list[tvm.runtime.Tensor] = []
        self._kernels = kernels

    def _launch(self, name: str, **values) -> None:
        """Append a launch to the plan; its buffers are checked against the kernel's signature once, here."""
        if name not in self._kernels:
            raise ArgumentError(f"kernels: no kernel {name!r} (build it for this preset and batch)")
        kernel = self._kernels[name]
        try:
            check_args(kernel.signature, values, kernel.device, check_weights=False)
        except ArgumentError as err:
            raise ArgumentError(f"{name}: {err} (kernels built for another configuration?)") from None
        self.plan.append((kernel.func, bind(kernel.signature, values)))
        self.launched.append(name)

    def _state(self, *shape: int) -> tvm.runtime.Tensor:
        t = _zeros(shape, self.device)
        self.states.append(t)
        return t

    def _act(self, *shape: int) -> tvm.runtime.Tensor:
        return tvm.runtime.empty(shape, "float32", self.device)

    def run(self) -> None:
        """Launch the plan once (inputs already in `x` and `io`)."""
        for func, args in self.plan:
            func(*args)

    def reset_slot(self, slot: int) -> None:
        """Zero every state row of `slot`."""
        for t in self.states:
            row = t.shape[1:]
            nbytes = int(np.prod(row)) * 4
            t._create_view(row, relative_byte_offset=slot * nbytes).copyfrom(np.zeros(row, np.float32))


class GDNLayer(_Layer):
    """projections -> conv1d+SiLU -> L2 norms -> gates -> delta rule -> gated RMSNorm -> out_proj."""

    kind = "gdn"

    def __init__(self, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor):
        super().__init__(cfg, kernels, weights, io, x)
        m, B, w = cfg.model, cfg.batch, self.weights
        hv, dv = m.n_v_heads, m.head_v_dim
        self.conv_state = self._state(cfg.slots, m.conv_dim, m.conv_kernel - 1)
        self.rec_state = self._state(cfg.slots, hv, dv, m.head_k_dim)
        mixed, qkv = self._act(B, m.conv_dim), self._act(B, m.conv_dim)
        z, b, a = self._act(B, hv, dv), self._act(B, hv), self._act(B, hv)
        qk, g, beta = self._act(B, 2 * m.n_k_heads, m.head_k_dim), self._act(B, hv), self._act(B, hv)
        o, y = self._act(B, hv, dv), self._act(B, hv, dv)
        self._launch("gemv_in_proj_qkv", w=w["in_proj_qkv"], x=x, y=mixed)
        self._launch("gemv_in_proj_z", w=w["in_proj_z"], x=x, y=_view(z, B, hv * dv))
        self._launch("gemv_in_proj_b", w=w["in_proj_b"], x=x, y=b)
        self._launch("gemv_in_proj_a", w=w["in_proj_a"], x=x, y=a)
        self._launch("causal_conv1d_silu", x=mixed, weight=w["conv1d"], state=self.conv_state, slots=io.slots, y=qkv)
        self._launch("per_head_l2_norm", qkv=qkv, qk=qk)
        self._launch("gates", a=a, b=b, A=w["A"], dt_bias=w["dt_bias"], g=g, beta=beta)
        self._launch("delta_rule", qk=qk, qkv=qkv, g=g, beta=beta, state=self.rec_state, slots=io.slots, o=o)
        self._launch("gated_rmsnorm", o=o, z=z, w=w["norm"], y=y)
        self._launch("gemv_out_proj", w=w["out_proj"], x=_view(y, B, hv * dv), y=self.out)


class AttentionLayer(_Layer):
    """projections -> split q/gate -> q/k RMSNorm -> RoPE -> KV scatter -> decode attention -> gate -> o_proj."""

    kind = "attention"

    def __init__(self, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor):
        super().__init__(cfg, kernels, weights, io, x)
        m, B, w = cfg.model, cfg.batch, self.weights
        hq, hkv, d = m.n_q_heads, m.n_kv_heads, m.head_dim
        self.k_cache = self._state(cfg.slots, cfg.max_len, hkv, d)
        self.v_cache = self._state(cfg.slots, cfg.max_len, hkv, d)
        qg, k, v = self._act(B, hq, 2 * d), self._act(B, hkv, d), self._act(B, hkv, d)
        q, gate, qn, kn = self._act(B, hq, d), self._act(B, hq, d), self._act(B, hq, d), self._act(B, hkv, d)
        qr, kr, attn, gated = self._act(B, hq, d), self._act(B, hkv, d), self._act(B, hq, d), self._act(B, hq, d)
        pos, slots = io.positions, io.slots
        self._launch("gemv_q_proj", w=w["q_proj"], x=x, y=_view(qg, B, hq * 2 * d))
        self._launch("gemv_k_proj", w=w["k_proj"], x=x, y=_view(k, B, hkv * d))
        self._launch("gemv_v_proj", w=w["v_proj"], x=x, y=_view(v, B, hkv * d))
        self._launch("split_interleaved", src=qg, q=q, gate=gate)
        self._launch("per_head_rmsnorm", q=q, k=k, q_norm=w["q_norm"], k_norm=w["k_norm"], q_out=qn, k_out=kn)
        self._launch("partial_neox_rope_indirect", q=qn, k=kn, positions=pos, q_out=qr, k_out=kr)
        caches = {"k_cache": self.k_cache, "v_cache": self.v_cache, "slots": slots, "positions": pos}
        self._launch("kv_row_scatter_indirect", k=kr, v=v, **caches)
        if cfg.n_splits > 1:
            ns = cfg.n_splits
            ml, lsum, acc = self._act(B, hq, ns), self._act(B, hq, ns), self._act(B, hq, ns, d)
            self._launch("decode_attention_split", q=qr, **caches, m=ml, l=lsum, acc=acc)
            self._launch("decode_attention_reduce", m=ml, l=lsum, acc=acc, slots=slots, positions=pos, out=attn)
        else:
            self._launch("decode_attention_indirect", q=qr, **caches, out=attn)
        self._launch("sigmoid_gate", x=attn, gate=gate, y=gated)
        self._launch("gemv_o_proj", w=w["o_proj"], x=_view(gated, B, hq * d), y=self.out)


LAYERS = {"gdn": GDNLayer, "attention": AttentionLayer}


def kernel_names(cfg: DecodeConfig, kinds: tuple[str, ...] = ("gdn", "attention")) -> list[str]:
    """Registry ops that the layers of `kinds` launch for `cfg`."""
    names = []
    if "gdn" in kinds:
        names += ["gemv_in_proj_qkv", "gemv_in_proj_z", "gemv_in_proj_b", "gemv_in_proj_a", "causal_conv1d_silu"]
        names += ["per_head_l2_norm", "gates", "delta_rule", "gated_rmsnorm", "gemv_out_proj"]
    if "attention" in kinds:
        names += ["gemv_q_proj", "gemv_k_proj", "gemv_v_proj", "split_interleaved", "per_head_rmsnorm"]
        names += ["partial_neox_rope_indirect", "kv_row_scatter_indirect", "sigmoid_gate", "gemv_o_proj"]
        names += (
            ["decode_attention_split", "decode_attention_reduce"] if cfg.n_splits > 1 else ["decode_attention_indirect"]
        )
    return names
