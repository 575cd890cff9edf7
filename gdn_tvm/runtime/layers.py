"""Layer executors: one decode step of a mixer as a fixed launch plan over compiled kernels.

A layer allocates its activations once, binds every kernel's arguments at construction, and each
step replays that list: no shape logic and no allocation in the step loop. State pools (conv and
recurrent states, KV caches) are `[slots, ...]` device tensors indexed by the step's slot ids.
The per-step inputs (x, slots, positions) live in a shared `StepBuffers`, written before the plan
runs, so the same plan (or a CUDA graph captured from it) serves every position.

At B = 1 a mixer's input projections are one GEMV over their stacked weights (`config.STACKED`), each consumer
reading its part of the one output row through a `row_view`: one launch where there were four (GDN) or three
(attention). From two lanes on a part is no longer contiguous across lanes, and each projection keeps its GEMV.
The GDN layer's L2 norm, gates and recurrence are one kernel (`delta_rule_fused`); at B = 1 its conv1d + SiLU is
the epilogue of the stacked input GEMV (`gemv_in_proj_conv`) and its gated RMSNorm the prologue of out_proj
(`gemv_out_proj_norm`): 3 launches (8 from two lanes, `fuses_gdn_stages`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping

import numpy as np
import tvm

from gdn_tvm.config import STACKED, DecodeConfig
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.runtime.views import ALIGN, row_view
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


def stacks_projections(cfg: DecodeConfig, stacked: str) -> bool:
    """Whether a step runs the projections of `STACKED[stacked]` as one GEMV: at B = 1 (see the module docstring),
    where every part starts `views.ALIGN`-aligned in the output row (all presets; not some toy shapes)."""
    starts = itertools.accumulate(cfg.model.projections[p][0] for p in STACKED[stacked][:-1])
    return cfg.batch == 1 and all(4 * start % ALIGN == 0 for start in starts)


class _Layer:
    """A mixer layer: `x` [B, hidden] in, `out` [B, hidden] out, a launch plan between them."""

    kind = ""
    stacked = ""  # its input projections' name in `STACKED`

    def __init__(self, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor):
        check_weights(cfg.model, self.kind, weights)
        self.cfg = cfg
        self.device = x.device
        self.io = io
        self.x = x
        self.out = tvm.runtime.empty((cfg.batch, cfg.model.hidden), "float32", self.device)
        self.stacks = stacks_projections(cfg, self.stacked)
        self.weights = upload(weights, self.device, self.stacked if self.stacks else "")
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

    def _project(self, *outputs: tuple[str, tuple[int, ...]], **conv) -> list[tvm.runtime.Tensor]:
        """Launch the input projections; returns their outputs, one activation of each `(projection, shape)` given in
        `STACKED` order: row views of one stacked GEMV's output at B = 1, else one GEMV into each. `conv` (the conv
        epilogue's conv_weight, state and slots): the GEMV producing the first output runs its `_conv` variant."""
        B = self.cfg.batch
        ops = _input_gemvs(self.cfg, self.stacked, conv=bool(conv))
        if not self.stacks:
            acts = [self._act(*shape) for _, shape in outputs]
            for i, (op, (name, _), y) in enumerate(zip(ops, outputs, acts, strict=True)):
                epilogue = conv if i == 0 else {}
                self._launch(op, w=self.weights[name], x=self.x, y=_view(y, B, y.numel() // B), **epilogue)
            return acts
        if tuple(name for name, _ in outputs) != STACKED[self.stacked]:
            raise ValueError(f"{self.stacked}: outputs {[n for n, _ in outputs]} are not {STACKED[self.stacked]}")
        self.projected = self._act(1, self.cfg.model.projections[self.stacked][0])  # owns the views' memory
        (op,) = ops
        self._launch(op, w=self.weights[self.stacked], x=self.x, y=self.projected, **conv)
        views, start = [], 0
        for _, shape in outputs:
            views.append(row_view(self.projected, start, shape))
            start += math.prod(shape)
        return views

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


def fuses_gdn_stages(cfg: DecodeConfig) -> bool:
    """Whether a GDN step runs conv1d + SiLU as its input GEMV's epilogue and gated RMSNorm as out_proj's prologue:
    at B = 1. From two lanes the prologue's per-CTA recompute covers every lane of a B tile (H200, qwen3.5-4b B=32:
    84 us against 36 us for gated_rmsnorm + out_proj) and the epilogue cost 1.8 us more than the conv it replaces."""
    return cfg.batch == 1


class GDNLayer(_Layer):
    """projections -> conv1d+SiLU -> (L2 norms, gates, delta rule: one kernel) -> gated RMSNorm -> out_proj; at
    B = 1 (`fuses_gdn_stages`) the conv is the projection's epilogue and the norm out_proj's prologue."""

    kind = "gdn"
    stacked = "in_proj"

    def __init__(self, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor):
        super().__init__(cfg, kernels, weights, io, x)
        m, B, w = cfg.model, cfg.batch, self.weights
        hv, dv = m.n_v_heads, m.head_v_dim
        self.conv_state = self._state(cfg.slots, m.conv_dim, m.conv_kernel - 1)
        self.rec_state = self._state(cfg.slots, hv, dv, m.head_k_dim)
        conv_state = {"state": self.conv_state, "slots": io.slots}
        fuses = fuses_gdn_stages(cfg)
        projections = ("in_proj_qkv", (B, m.conv_dim)), ("in_proj_z", (B, hv * dv)), ("in_proj_b", (B, hv))
        epilogue = {"conv_weight": w["conv1d"], **conv_state} if fuses else {}
        qkv, z, b, a = self._project(*projections, ("in_proj_a", (B, hv)), **epilogue)
        if not fuses:  # the projection's rows go through the conv kernel
            mixed, qkv = qkv, self._act(B, m.conv_dim)
            self._launch("causal_conv1d_silu", x=mixed, weight=w["conv1d"], **conv_state, y=qkv)
        o = self._act(B, hv * dv)
        fused = {"a": a, "b": b, "A": w["A"], "dt_bias": w["dt_bias"]}
        self._launch("delta_rule_fused", qkv=qkv, **fused, state=self.rec_state, slots=io.slots, o=_view(o, B, hv, dv))
        if fuses:
            self._launch("gemv_out_proj_norm", w=w["out_proj"], x=o, z=z, norm_weight=w["norm"], y=self.out)
        else:
            y = self._act(B, hv * dv)
            heads = {"o": _view(o, B, hv, dv), "z": _view(z, B, hv, dv), "w": w["norm"], "y": _view(y, B, hv, dv)}
            self._launch("gated_rmsnorm", **heads)
            self._launch("gemv_out_proj", w=w["out_proj"], x=y, y=self.out)


class AttentionLayer(_Layer):
    """projections -> split q/gate -> q/k RMSNorm -> RoPE -> KV scatter -> decode attention -> gate -> o_proj."""

    kind = "attention"
    stacked = "qkv_proj"

    def __init__(self, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor):
        super().__init__(cfg, kernels, weights, io, x)
        m, B, w = cfg.model, cfg.batch, self.weights
        hq, hkv, d = m.n_q_heads, m.n_kv_heads, m.head_dim
        self.k_cache = self._state(cfg.slots, cfg.max_len, hkv, d)
        self.v_cache = self._state(cfg.slots, cfg.max_len, hkv, d)
        qg, k, v = self._project(("q_proj", (B, hq, 2 * d)), ("k_proj", (B, hkv, d)), ("v_proj", (B, hkv, d)))
        q, gate, qn, kn = self._act(B, hq, d), self._act(B, hq, d), self._act(B, hq, d), self._act(B, hkv, d)
        qr, kr, attn, gated = self._act(B, hq, d), self._act(B, hkv, d), self._act(B, hq, d), self._act(B, hq, d)
        pos, slots = io.positions, io.slots
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


def _input_gemvs(cfg: DecodeConfig, stacked: str, conv: bool = False) -> list[str]:
    """The GEMVs of a mixer's input projections: the stacked one, or one a projection; `conv`: the first runs the
    conv epilogue."""
    names = [stacked] if stacks_projections(cfg, stacked) else list(STACKED[stacked])
    return [f"gemv_{p}_conv" if conv and i == 0 else f"gemv_{p}" for i, p in enumerate(names)]


def kernel_names(cfg: DecodeConfig, kinds: tuple[str, ...] = ("gdn", "attention")) -> list[str]:
    """Registry ops that the layers of `kinds` launch for `cfg`."""
    names = []
    if "gdn" in kinds:
        fuses = fuses_gdn_stages(cfg)
        names += _input_gemvs(cfg, "in_proj", conv=fuses)
        if fuses:
            names += ["delta_rule_fused", "gemv_out_proj_norm"]
        else:
            names += ["causal_conv1d_silu", "delta_rule_fused", "gated_rmsnorm", "gemv_out_proj"]
    if "attention" in kinds:
        names += _input_gemvs(cfg, "qkv_proj")
        names += ["split_interleaved", "per_head_rmsnorm", "partial_neox_rope_indirect", "kv_row_scatter_indirect"]
        names += ["sigmoid_gate", "gemv_o_proj"]
        names += (
            ["decode_attention_split", "decode_attention_reduce"] if cfg.n_splits > 1 else ["decode_attention_indirect"]
        )
    return names
