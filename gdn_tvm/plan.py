"""A decode step as data: each layer kind's `plan(cfg)` is the buffers it needs and the launches over them.

The runtime binds a plan once (`runtime.layers.Layer`: allocates activations and states, takes weights and the
step's inputs, checks every launch's buffers against its kernel's signature) and replays its launches; `make tune`
and `make build` take the ops a configuration launches from the same plans (`step_ops`). What a step fuses is one
table, `fusions(cfg)`, read by the plans alone. Pure Python over `config`: the runtime imports it without the
compiler.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gdn_tvm.config import LIBRARY_GEMMS, STACKED, STOP_IDS, DecodeConfig, ModelConfig, split_width

ROLES = ("input", "weight", "state", "act", "view")
FLOAT32_WEIGHTS = frozenset({"A", "dt_bias"})  # the gates' per-head parameters: float32 whatever the weight dtype
VIEW_ALIGN = 64  # bytes: where a row view of a stacked projection may start (the kernels' vector loads)
# Library GEMMs (`Fusions.library_gemm`): every projection from LIBRARY_GEMM_LANES lanes; from LIBRARY_GEMM_MIN_LANES
# those whose weight holds at least LIBRARY_GEMM_MIN_WEIGHT elements, where cuBLAS fills the GPU with output tiles.
LIBRARY_GEMM_LANES = 16
LIBRARY_GEMM_MIN_LANES = 4
LIBRARY_GEMM_MIN_WEIGHT = 1 << 22


@dataclass(frozen=True)
class Buffer:
    """One tensor of a plan. `role`: input (bound by the caller: `x`, the layer's input row, and the step's `slots`
    and `positions`), weight (the layer's, by name), state (a pool `[slots, ...]` zeroed at bind and per released
    slot), act (allocated once), view (`shape` over the elements `[start, start + prod(shape))` of buffer `base`,
    sharing its memory)."""

    shape: tuple[int, ...]
    role: str
    dtype: str = "float32"
    base: str = ""
    start: int = 0

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class Launch:
    """One kernel call: registry op `op`, each visible argument bound to a plan buffer by name."""

    op: str
    args: Mapping[str, str]


@dataclass(frozen=True)
class Plan:
    """A step (one layer's, or the model's): `buffers` by name (a view after its base), `launches` in order, `out` the
    buffer holding its output, `weights` the weights it takes by checkpoint name (shape and stored dtype), and
    `stacks` the weight buffers made of several of those (name -> the parts, stacked row-wise in order)."""

    kind: str
    buffers: Mapping[str, Buffer]
    launches: tuple[Launch, ...]
    out: str = "out"
    weights: Mapping[str, Buffer] = field(default_factory=dict)
    stacks: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def ops(self) -> list[str]:
        """The registry ops launched, in first-launch order."""
        return list(dict.fromkeys(launch.op for launch in self.launches))


@dataclass(frozen=True)
class Fusions:
    """What a step of a configuration fuses; each is the measured faster choice (docs/design.md).

    stacked: the `STACKED` projections run as one GEMV over their concatenated weights, each consumer reading its
      part of the one output row: at B = 1, where every part starts `VIEW_ALIGN`-aligned (all presets). From two
      lanes a part is strided across lanes.
    gdn_stages: causal conv1d + SiLU as the epilogue of the GDN input GEMV and gated RMSNorm as the prologue of
      out_proj: at B = 1. From two lanes the prologue's per-CTA recompute covers every lane of a B tile (qwen3.5-4b
      B=32 on the H200: 84 us against 36 us for the two kernels), and the epilogue cost 1.8 us more than the conv.
    split_kv: attention over `split_len` chunks in parallel, then a reduce kernel: where the cache holds more than
      one chunk.
    block_stages: the decoder layer's RMSNorms as the prologues of the GEMVs reading the residual stream (the
      stacked mixer input, gate|up) and its residual adds as the epilogues of those writing a sublayer's output
      (out_proj, o_proj, down_proj): no norm launch inside the model's layers. At B = 1 where both mixers' inputs
      are stacked; from two lanes each CTA would recompute the norms of every lane of its B tile.
    library_gemm: the projections (of `LIBRARY_GEMMS`) run as a library GEMM (`gemm_<proj>`: cuBLAS on CUDA) over
      their input split into two bf16 rows (`split_bf16_<width>`, once per input), gate|up's SwiGLU then a kernel
      of its own; with bf16 weights, every projection from `LIBRARY_GEMM_LANES` lanes, from `LIBRARY_GEMM_MIN_LANES`
      those of at least `LIBRARY_GEMM_MIN_WEIGHT` weights. On the H200 (`h200_cublas_split.jsonl`) cuBLAS over the
      split rows takes 4b B=32 qkv 14.9 us and B=128 gate|up 39.1 where the tuned tensor-core GEMVs took 37.4 and
      ~360. Below 16 lanes (`h200_model_library_lanes.jsonl`) small weights fill too few cuBLAS tiles: at 0.8b B=8
      in_proj_z, out_proj and b/a run faster as GEMVs, the LM head, gate|up and qkv as GEMMs; at B=2 the GEMVs win
      (4b 4.24 against 4.59 ms a token with every projection a GEMM).
    library_stacks: the `STACKED` projections whose first part is a library GEMM run as one library GEMM over the
      stacked weight (`gemm_<stack>`), each part's columns into an output of its own. cuBLAS on the H200
      (`h200_cublas_stacked.jsonl`, split rows, cold L2), us, the stack against its parts apart at B = 4 .. 128: the
      GDN in_proj 7.5-10.7 against 19.2-22.8 (0.8b), 20.0-28.3 against 34.6-45.3 (4b); the attention qkv_proj 6.1-8.1
      against 14.6-16.6, 17.2-24.9 against 27.3-35.9: a GEMM of a few rows (b, a: 16-32) costs as much as a large
      one's ramp."""

    stacked: frozenset[str]
    gdn_stages: bool
    split_kv: bool
    block_stages: bool
    library_gemm: frozenset[str]
    library_stacks: frozenset[str]


def fusions(cfg: DecodeConfig) -> Fusions:
    """The fusion table of `cfg`."""

    def aligned(name: str) -> bool:
        starts = itertools.accumulate(cfg.model.projections[p][0] for p in STACKED[name][:-1])
        return all(4 * start % VIEW_ALIGN == 0 for start in starts)

    stacked = frozenset(name for name in STACKED if cfg.batch == 1 and aligned(name))
    library = library_gemms(cfg)
    return Fusions(
        stacked=stacked,
        gdn_stages=cfg.batch == 1,
        split_kv=cfg.n_splits > 1,
        block_stages=cfg.batch == 1 and stacked == frozenset(STACKED),
        library_gemm=library,
        library_stacks=frozenset(s for s, parts in STACKED.items() if parts[0] in library and s not in stacked),
    )


def library_gemms(cfg: DecodeConfig) -> frozenset[str]:
    """The projections `cfg` runs as library GEMMs (`Fusions.library_gemm`)."""
    if cfg.weight_dtype != "bfloat16" or cfg.batch < LIBRARY_GEMM_MIN_LANES:
        return frozenset()
    sizes = cfg.model.projections
    return frozenset(
        p for p in LIBRARY_GEMMS if cfg.batch >= LIBRARY_GEMM_LANES or math.prod(sizes[p]) >= LIBRARY_GEMM_MIN_WEIGHT
    )


def gdn_weights(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """GDN mixer weights by checkpoint name, in kernel layouts (conv1d `[C, Kc]`, A = -exp(A_log))."""
    p = m.projections
    return {
        "in_proj_qkv": p["in_proj_qkv"],
        "in_proj_z": p["in_proj_z"],
        "in_proj_b": p["in_proj_b"],
        "in_proj_a": p["in_proj_a"],
        "conv1d": (m.conv_dim, m.conv_kernel),
        "dt_bias": (m.n_v_heads,),
        "A": (m.n_v_heads,),
        "norm": (m.head_v_dim,),
        "out_proj": p["out_proj"],
    }


def attention_weights(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Gated attention mixer weights by checkpoint name (q_norm, k_norm zero-centred, as stored: the kernel scales by
    1 + w)."""
    p = m.projections
    return {
        "q_proj": p["q_proj"],
        "k_proj": p["k_proj"],
        "v_proj": p["v_proj"],
        "q_norm": (m.head_dim,),
        "k_norm": (m.head_dim,),
        "o_proj": p["o_proj"],
    }


WEIGHTS = {"gdn": gdn_weights, "attention": attention_weights}


def block_weights(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """A decoder layer's weights around its mixer, by checkpoint name: its two norms (zero-centred, as stored) and,
    where the model's MLP is dense, the SwiGLU MLP's (`mlp.` in the checkpoint)."""
    names: dict[str, tuple[int, ...]] = {"input_layernorm": (m.hidden,), "post_attention_layernorm": (m.hidden,)}
    if m.intermediate_size is not None:
        width = m.intermediate_size
        names |= {"gate_proj": (width, m.hidden), "up_proj": (width, m.hidden), "down_proj": (m.hidden, width)}
    return names


def model_weights(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The weights outside the layers, by checkpoint name: the embedding table, the final norm (zero-centred) and the LM
    head (the embedding table itself where `tie_word_embeddings`)."""
    return {"embed_tokens": (m.vocab_size, m.hidden), "norm": (m.hidden,), "lm_head": (m.vocab_size, m.hidden)}


def stored_dtype(name: str, weight_dtype: str) -> str:
    """The dtype weight `name` (a `WEIGHTS` name or a `STACKED` one) is stored in at a config's `weight_dtype`."""
    return "float32" if name in FLOAT32_WEIGHTS else weight_dtype


class _Builder:
    """Collects a plan's buffers, launches and weights; every method returns the buffer's name."""

    def __init__(self, kind: str, cfg: DecodeConfig, stacked: str = ""):
        self.cfg, self.kind = cfg, kind
        self.fusions = fusions(cfg)
        self.stacked = stacked if stacked in self.fusions.stacked else ""
        self.library_stack = stacked if stacked in self.fusions.library_stacks else ""
        self.buffers: dict[str, Buffer] = {}
        self.launches: list[Launch] = []
        self.weights: dict[str, Buffer] = {}
        self.stacks: dict[str, tuple[str, ...]] = {}

    def mixer_inputs(self, block: bool = False) -> None:
        """A mixer's inputs (x, the step's slots and positions; with `block`, the decoder layer's `input_norm`
        weight, x being the residual stream) and its weights, stacked where the fusions say."""
        B, m = self.cfg.batch, self.cfg.model
        self.add("x", (B, m.hidden), "input")
        if block:
            self.add("input_norm", (m.hidden,), "input", self.cfg.weight_dtype)
        self.add("slots", (B,), "input", "int32")
        self.add("positions", (B,), "input", "int32")
        stack = self.stacked or self.library_stack
        parts = STACKED.get(stack, ())
        for name, shape in WEIGHTS[self.kind](m).items():
            self.weight(name, shape, buffer=name not in parts)
        if stack:
            self.stack(stack, parts, m.projections[stack])

    def weight(self, name: str, shape: tuple[int, ...], buffer: bool = True) -> str:
        """Weight `name` taken by the plan (in its stored dtype); a buffer of its own unless part of a stack."""
        dtype = stored_dtype(name.rsplit(".", 1)[-1], self.cfg.weight_dtype)
        self.weights[name] = Buffer(tuple(shape), "weight", dtype)
        return self.add(name, shape, "weight", self.weights[name].dtype) if buffer else name

    def stack(self, name: str, parts: Iterable[str], shape: tuple[int, ...]) -> str:
        """A weight buffer holding `parts` (weights taken, without buffers of their own) stacked row-wise."""
        self.stacks[name] = tuple(parts)
        return self.add(name, shape, "weight", self.cfg.weight_dtype)

    def add(self, name: str, shape: tuple[int, ...], role: str, dtype: str = "float32", base: str = "", start: int = 0):
        if name in self.buffers:
            raise ValueError(f"{self.kind} plan: buffer {name!r} declared twice")
        self.buffers[name] = Buffer(tuple(shape), role, dtype, base, start)
        return name

    def act(self, name: str, *shape: int) -> str:
        return self.add(name, shape, "act")

    def state(self, name: str, *shape: int, dtype: str = "float32") -> str:
        return self.add(name, shape, "state", dtype)

    def view(self, base: str, *shape: int, start: int = 0, name: str = "") -> str:
        """`shape` over `base` from element `start` (a reshape at 0); named `<base>.<dims>` unless `name`."""
        name = name or f"{base}.{'x'.join(map(str, shape))}"
        return name if name in self.buffers else self.add(name, shape, "view", base=base, start=start)

    def launch(self, op: str, **args: str) -> None:
        unknown = sorted(b for b in args.values() if b not in self.buffers)
        if unknown:
            raise ValueError(f"{self.kind} plan: {op} binds undeclared buffers {unknown}")
        self.launches.append(Launch(op, args))

    def gemv(self, proj: str, x: str, y: str, w: str = "", xs: str = "") -> None:
        """`y = x @ w.T` of projection `proj` (weight buffer `w`, default `proj`; x and y `[B, K]`, `[B, N]`): one
        GEMV, or for a projection in `fusions.library_gemm` the library GEMM over `xs` (x already split), else over x
        split here."""
        if proj not in self.fusions.library_gemm:
            self.launch(f"gemv_{proj}", w=w or proj, x=x, y=y)
            return
        self.launch(f"gemm_{proj}", w=w or proj, xs=xs or self.split(x, split_width(proj)), y=y)

    def split(self, x: str, width: str) -> str:
        """x `[B, K]` split into two bf16 rows (`split_bf16_<width>`) in the plan's buffer of that width."""
        B, K = self.cfg.batch, self.cfg.model.split_cols(width)
        name = f"split_{width}"
        if name not in self.buffers:
            self.add(name, (2, B, K), "act", "bfloat16")
        self.launch(f"split_bf16_{width}", x=x, xs=name)
        return name

    def project(
        self, outputs: Iterable[tuple[str, str, tuple[int, ...]]], norm_weight: str = "", **epilogue: str
    ) -> list[str]:
        """The layer's input projections, `(projection, output name, shape)` in `STACKED` order; returns the output
        buffers. Stacked: row views of one GEMV's output row; a library stack: one library GEMM into all of them;
        else one GEMV into each. `epilogue` (the conv's conv_weight, state, slots) goes to the GEMV producing the
        first output, which runs its `_conv` variant; `norm_weight` (stacked only) makes the GEMV normalise x first
        (its `_rmsnorm` variant)."""
        outputs = list(outputs)
        B, conv = self.cfg.batch, "_conv" if epilogue else ""
        if norm_weight and not self.stacked:
            raise ValueError(f"{self.kind} plan: an RMSNorm prologue needs the stacked input projection")
        stack = self.stacked or self.library_stack
        if stack and tuple(proj for proj, _, _ in outputs) != STACKED[stack]:
            raise ValueError(f"{stack}: outputs {[p for p, _, _ in outputs]} are not {STACKED[stack]}")
        if self.library_stack:
            if epilogue:
                raise ValueError(f"{self.kind} plan: a library GEMM takes no conv epilogue")
            names = [self.act(name, *shape) for _, name, shape in outputs]
            views = [self.view(y, B, math.prod(shape) // B) for (_, _, shape), y in zip(outputs, names, strict=True)]
            parts = dict(zip(STACKED[stack], views, strict=True))
            self.launch(f"gemm_{stack}", w=stack, xs=self.split("x", "hidden"), **parts)
            return names
        if not self.stacked:
            names = []
            library = any(proj in self.fusions.library_gemm for proj, _, _ in outputs)
            xs = self.split("x", "hidden") if library else ""
            for i, (proj, name, shape) in enumerate(outputs):
                y = self.act(name, *shape)
                flat = self.view(y, B, math.prod(shape) // B)
                if i == 0 and epilogue:
                    self.launch(f"gemv_{proj}{conv}", w=proj, x="x", y=flat, **epilogue)
                else:
                    self.gemv(proj, "x", flat, xs=xs)
                names.append(y)
            return names
        whole = self.act(f"{self.stacked}_out", 1, self.cfg.model.projections[self.stacked][0])
        if norm_weight:
            epilogue = {"norm_weight": norm_weight, **epilogue}
        op = f"gemv_{self.stacked}{'_rmsnorm' if norm_weight else ''}{conv}"
        self.launch(op, w=self.stacked, x="x", y=whole, **epilogue)
        names, start = [], 0
        for _, name, shape in outputs:
            names.append(self.view(whole, *shape, start=start, name=name))
            start += math.prod(shape)
        return names

    def nest(self, prefix: str, sub: Plan, inputs: Mapping[str, str]) -> str:
        """`sub`'s buffers, weights and launches under `prefix`, its inputs bound to this plan's buffers `inputs`
        (by the sub-plan's input name); returns the name of its output."""
        names = dict(inputs)
        for name, buffer in sub.buffers.items():
            if buffer.role == "input":
                continue
            names[name] = prefix + name
            if buffer.role == "weight":
                continue
            base = names[buffer.base] if buffer.base else ""
            self.add(prefix + name, buffer.shape, buffer.role, buffer.dtype, base, buffer.start)
        for name, w in sub.weights.items():
            self.weights[prefix + name] = w
            if name in sub.buffers:
                self.add(prefix + name, w.shape, "weight", w.dtype)
        for name, parts in sub.stacks.items():
            self.stacks[prefix + name] = tuple(prefix + part for part in parts)
            self.add(prefix + name, sub.buffers[name].shape, "weight", sub.buffers[name].dtype)
        for launch in sub.launches:
            self.launch(launch.op, **{arg: names[buffer] for arg, buffer in launch.args.items()})
        return names[sub.out]

    def done(self, out: str) -> Plan:
        return Plan(self.kind, dict(self.buffers), tuple(self.launches), out, dict(self.weights), dict(self.stacks))


def gdn(cfg: DecodeConfig, block: bool = False) -> Plan:
    """projections -> conv1d + SiLU -> `delta_rule_fused` (L2 norms, gates, recurrence) -> gated RMSNorm -> out_proj;
    with `fusions.gdn_stages` the conv is the projection's epilogue and the norm out_proj's prologue (3 launches at
    B = 1, 8 from two lanes, the four projections one launch and its input's split under `library_stacks`). `block`
    (a decoder layer's mixer under `fusions.block_stages`): x is the residual stream, normalised by the input
    projection (`input_norm`), and out_proj adds into it in place (the plan's out)."""
    m, B = cfg.model, cfg.batch
    hv, dv = m.n_v_heads, m.head_v_dim
    p = _Builder("gdn", cfg, "in_proj")
    p.mixer_inputs(block)
    conv_state = p.state("conv_state", cfg.slots, m.conv_dim, m.conv_kernel - 1)
    p.state("rec_state", cfg.slots, hv, dv, m.head_k_dim, dtype=cfg.state_dtype)
    fused = p.fusions.gdn_stages
    conv = {"conv_weight": "conv1d", "state": conv_state, "slots": "slots"}
    first = "qkv" if fused else "mixed"  # the epilogue's conv output, or the rows the conv kernel reads
    projections = [("in_proj_qkv", first, (B, m.conv_dim)), ("in_proj_z", "z", (B, hv * dv))]
    projections += [("in_proj_b", "b", (B, hv)), ("in_proj_a", "a", (B, hv))]
    qkv, z, b, a = p.project(projections, "input_norm" if block else "", **(conv if fused else {}))
    if not fused:  # the projection's rows go through the conv kernel
        mixed, qkv = qkv, p.act("qkv", B, m.conv_dim)
        p.launch("causal_conv1d_silu", x=mixed, weight="conv1d", state=conv_state, slots="slots", y=qkv)
    o = p.act("o", B, hv * dv)
    gates = {"a": a, "b": b, "A": "A", "dt_bias": "dt_bias"}
    p.launch("delta_rule_fused", qkv=qkv, **gates, state="rec_state", slots="slots", o=p.view(o, B, hv, dv))
    if block:
        if not fused:
            raise ValueError("gdn plan: block stages need the GDN stages")
        p.launch("gemv_out_proj_norm_residual", w="out_proj", x=o, z=z, norm_weight="norm", residual="x")
        return p.done("x")
    out = p.act("out", B, m.hidden)
    if fused:
        p.launch("gemv_out_proj_norm", w="out_proj", x=o, z=z, norm_weight="norm", y=out)
    else:
        y = p.act("normed", B, hv * dv)
        heads = {"o": p.view(o, B, hv, dv), "z": p.view(z, B, hv, dv), "w": "norm", "y": p.view(y, B, hv, dv)}
        p.launch("gated_rmsnorm", **heads)
        p.gemv("out_proj", y, out)
    return p.done(out)


def attention(cfg: DecodeConfig, block: bool = False) -> Plan:
    """projections -> `attention_prologue` (split q/gate, q/k RMSNorm, RoPE, KV scatter: one kernel) -> decode
    attention and its output gate (split-KV, then the reduce, which gates what it merges, with `fusions.split_kv`;
    else unsplit, then `sigmoid_gate`) -> o_proj. `block`: as `gdn`'s (the projection normalises the residual stream
    x, o_proj adds into it)."""
    m, B = cfg.model, cfg.batch
    hq, hkv, d = m.n_q_heads, m.n_kv_heads, m.head_dim
    p = _Builder("attention", cfg, "qkv_proj")
    p.mixer_inputs(block)
    for cache in ("k_cache", "v_cache"):
        p.state(cache, cfg.slots, cfg.max_len, hkv, d, dtype=cfg.kv_dtype)
    projections = [("q_proj", "q_gate", (B, hq, 2 * d)), ("k_proj", "k", (B, hkv, d)), ("v_proj", "v", (B, hkv, d))]
    qg, k, v = p.project(projections, "input_norm" if block else "")
    gate, qr = p.act("gate", B, hq, d), p.act("q_rotated", B, hq, d)
    gated = p.act("gated", B, hq, d)
    index = {"slots": "slots", "positions": "positions"}
    caches = {"k_cache": "k_cache", "v_cache": "v_cache", **index}
    p.launch("attention_prologue", q_gate=qg, k=k, v=v, q_norm="q_norm", k_norm="k_norm", **caches, q_out=qr, gate=gate)
    if p.fusions.split_kv:
        ns = cfg.n_splits
        partials = {"m": p.act("split_max", B, hq, ns), "l": p.act("split_sum", B, hq, ns)}
        partials["acc"] = p.act("split_acc", B, hq, ns, d)
        p.launch("decode_attention_split", q=qr, **caches, **partials)
        p.launch("decode_attention_reduce", **partials, gate=gate, **index, out=gated)
    else:
        attn = p.act("attended", B, hq, d)
        p.launch("decode_attention", q=qr, **caches, out=attn)
        p.launch("sigmoid_gate", x=attn, gate=gate, y=gated)
    if block:
        p.launch("gemv_o_proj_residual", w="o_proj", x=p.view(gated, B, hq * d), residual="x")
        return p.done("x")
    out = p.act("out", B, m.hidden)
    p.gemv("o_proj", p.view(gated, B, hq * d), out)
    return p.done(out)


PLANS = {"gdn": gdn, "attention": attention}

# The model step's per-lane inputs besides the token ids, slots and positions: name -> (shape at (batch, max_len),
# dtype). Sampling parameters (ops/sample.py), the lanes' prompts and limits and the stop list (ops/advance.py).
LANE_INPUTS = {
    "temperature": (lambda B, L: (B,), "float32"),
    "top_k": (lambda B, L: (B,), "int32"),
    "top_p": (lambda B, L: (B,), "float32"),
    "seed": (lambda B, L: (B,), "int64"),
    "steps": (lambda B, L: (B,), "int64"),
    "prompts": (lambda B, L: (B, L), "int32"),
    "prompt_lens": (lambda B, L: (B,), "int32"),
    "limits": (lambda B, L: (B,), "int32"),
    "stop_ids": (lambda B, L: (STOP_IDS,), "int32"),
}


def model(cfg: DecodeConfig, sampling: bool = True) -> Plan:
    """The whole model's step, token ids in, next token ids out (Hugging Face's `Qwen3_5ForCausalLM`, docs/math.md):
    embedding -> per layer: RMSNorm (with the residual add from the second layer on), its mixer's plan (under
    `layers.<i>.`), residual add + RMSNorm, SwiGLU MLP (gate|up stacked, one GEMV with `silu(gate) * up` as its
    epilogue, then down) -> residual add + final RMSNorm -> LM head (the embedding table itself where tied) ->
    `sample` (`argmax` without `sampling`: every lane greedy, one launch where `sample` chains 35) -> `advance`,
    which writes the next step's `ids` and moves positions, steps and finished slots on. With `fusions.block_stages`
    a layer's norms are the prologues of the GEMVs after them and its residual adds the epilogues of those before them
    (the final norm a plain `rmsnorm`)."""
    m, B = cfg.model, cfg.batch
    if m.intermediate_size is None:
        raise ValueError(f"{m.name}: no dense MLP (mixture-of-experts models are not planned)")
    p = _Builder("model", cfg)
    for name, dtype in (("ids", "int32"), ("slots", "int32"), ("positions", "int32")):
        p.add(name, (B,), "input", dtype)
    for name, (shape, dtype) in LANE_INPUTS.items():
        p.add(name, shape(B, cfg.max_len), "input", dtype)
    outer = model_weights(m)
    p.weight("embed_tokens", outer["embed_tokens"])
    p.weight("norm", outer["norm"])
    if m.tie_word_embeddings:
        p.view("embed_tokens", *outer["lm_head"], name="lm_head")
    else:
        p.weight("lm_head", outer["lm_head"])
    hidden, normed = p.act("hidden", B, m.hidden), p.act("normed", B, m.hidden)
    mlp_act = p.act("mlp_act", B, m.intermediate_size)
    fused = p.fusions.block_stages
    if not fused:
        mlp_in, mlp_out = p.act("mlp_in", B, m.hidden), p.act("mlp_out", B, m.hidden)
    library_mlp = "gate_up_proj" in p.fusions.library_gemm
    if library_mlp:
        gate_up_out = p.act("gate_up", B, 2 * m.intermediate_size)
    p.launch("embedding", ids="ids", table="embed_tokens", rows=hidden)
    step = {"slots": "slots", "positions": "positions"}
    for i, kind in enumerate(m.layer_types):
        prefix, block = f"layers.{i}.", block_weights(m)
        for name in ("input_layernorm", "post_attention_layernorm", "down_proj"):
            p.weight(prefix + name, block[name])
        parts = (prefix + "gate_proj", prefix + "up_proj")
        for part in parts:
            p.weight(part, block[part.rsplit(".", 1)[-1]], buffer=False)
        gate_up = p.stack(prefix + "gate_up_proj", parts, m.projections["gate_up_proj"])
        input_norm, post_norm = prefix + "input_layernorm", prefix + "post_attention_layernorm"
        if fused:  # the norms in the GEMVs reading the stream, the residual adds in those writing into it
            p.nest(prefix, PLANS[kind](cfg, block=True), {"x": hidden, "input_norm": input_norm, **step})
            p.launch("gemv_gate_up_proj_rmsnorm_swiglu", w=gate_up, x=hidden, norm_weight=post_norm, y=mlp_act)
            p.launch("gemv_down_proj_residual", w=prefix + "down_proj", x=mlp_act, residual=hidden)
            continue
        if i == 0:
            p.launch("rmsnorm", x=hidden, weight=input_norm, y=normed)
        else:
            p.launch("add_rmsnorm", x=mlp_out, residual=hidden, weight=input_norm, y=normed)
        out = p.nest(prefix, PLANS[kind](cfg), {"x": normed, **step})
        p.launch("add_rmsnorm", x=out, residual=hidden, weight=post_norm, y=mlp_in)
        if library_mlp:
            p.gemv("gate_up_proj", mlp_in, gate_up_out, w=gate_up)
            p.launch("swiglu", x=gate_up_out, y=mlp_act)
        else:
            p.launch("gemv_gate_up_proj_swiglu", w=gate_up, x=mlp_in, y=mlp_act)
        p.gemv("down_proj", mlp_act, mlp_out, w=prefix + "down_proj")
    if fused:
        p.launch("rmsnorm", x=hidden, weight="norm", y=normed)
    else:
        p.launch("add_rmsnorm", x=mlp_out, residual=hidden, weight="norm", y=normed)
    logits = p.act("logits", B, m.vocab_size)
    p.gemv("lm_head", normed, logits)
    sampled = p.add("sampled", (B,), "act", "int32")
    if sampling:
        draw = {name: name for name in ("temperature", "top_k", "top_p", "seed")}
        work = {name: p.add(name, shape, "act", dtype) for name, (shape, dtype) in cfg.sample_workspace.items()}
        p.launch("sample", logits=logits, **draw, step="steps", tokens=sampled, **work)
    else:
        chunks = (B, cfg.argmax_chunks)
        first = p.add("chunk_first", chunks, "act", "int32")
        arrivals = p.add("arrivals", (B,), "act", "int32")  # zero from the start, as integer activations are
        p.launch(
            "argmax",
            logits=logits,
            chunk_max=p.act("chunk_max", *chunks),
            chunk_first=first,
            tokens=sampled,
            arrivals=arrivals,
        )
    lanes = {name: name for name in ("prompts", "prompt_lens", "limits", "stop_ids", "positions", "slots", "steps")}
    events = p.add("events", (2, B), "act", "int32")
    p.launch("advance", sampled=sampled, **lanes, ids="ids", events=events)
    return p.done(events)


def layer_kinds(cfg: DecodeConfig) -> tuple[str, ...]:
    """The layer kinds of `cfg`'s model, in `PLANS` order."""
    present = set(cfg.model.layer_types)
    return tuple(kind for kind in PLANS if kind in present)


def model_ops(cfg: DecodeConfig) -> list[str]:
    """The registry ops the whole model's step launches, sampling or greedy (`model`), in first-launch order: what
    `make build ARGS="--ops model"` builds."""
    return list(dict.fromkeys(model(cfg).ops + model(cfg, sampling=False).ops))


def step_ops(cfg: DecodeConfig, kinds: Iterable[str] | None = None) -> list[str]:
    """The registry ops a step of `cfg` launches (the plans of `kinds`, default every kind of its model), in
    first-launch order: what `make tune` and `make build` cover by default."""
    kinds = layer_kinds(cfg) if kinds is None else tuple(kinds)
    return list(dict.fromkeys(op for kind in kinds for op in PLANS[kind](cfg).ops))
