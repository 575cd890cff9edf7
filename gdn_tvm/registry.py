"""The one table of operators: tests, tuning, build and benchmarks all iterate `OPS`.

Each `Op` ties a TensorIR factory (`gdn_tvm.ops.<family>.make_<family>`), its signature, the
float64 numpy reference (`gdn_tvm.reference.<family>`) and the hand schedules per target kind
(`gdn_tvm.schedules.<family>.{llvm,cuda}`). Variants (split-KV stages, which
projection) are flags bound here, so one factory serves all of an op's variants.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from importlib import import_module

from tvm import s_tir, tirx

from gdn_tvm import naming
from gdn_tvm.config import LIBRARY_GEMMS, SPLIT_WIDTHS, STACKED, DecodeConfig
from gdn_tvm.signature import Arg

TARGET_KINDS = ("llvm", "cuda")
KNOB_GRIDS = {"cuda": "KNOBS", "llvm": "LLVM_KNOBS"}  # module attribute holding each kind's knob grid
IN_PLACE_ATTR = "gdn_tvm.in_place"  # compile without no-alias assumptions (see codegen/compile.py)


@dataclass(frozen=True)
class Op:
    """A registry entry; `sizes(cfg)` gives every config value its PrimFunc reads, by field name, and nothing else
    (tests/test_naming.py checks both): the workload key."""

    name: str
    family: str
    make: Callable[[DecodeConfig], tirx.PrimFunc]
    signature: Callable[[DecodeConfig], list[Arg]]
    reference: Callable[..., None]
    schedules: Mapping[str, Callable[..., None]]
    # target kind -> knob grid of its hand schedule (may be empty), or a tuple of grids (their union)
    knobs: Mapping[str, Mapping[str, tuple] | tuple[Mapping[str, tuple], ...]]
    sizes: Callable[[DecodeConfig], dict[str, object]]
    exact: bool = False  # pure data movement: compared bit for bit
    key_name: str = ""  # workload-key prefix; ops of one shape family (gemv) share it
    ref_params: tuple[str, ...] = ()  # config fields the reference takes as keywords (not implied by shapes)
    flags: Mapping[str, object] = field(default_factory=dict)
    library: str = ""  # what computes the op on CUDA instead of a TensorIR kernel (`runtime.cublas`): none to tune

    def compiled(self, target_kind: str) -> bool:
        """The op is a TensorIR kernel on `target_kind` (not a library call): what tuning and builds schedule."""
        return not (self.library and target_kind == "cuda")

    def run_reference(self, cfg: DecodeConfig, values: Mapping[str, object]) -> None:
        """The reference on `values` (float64 copies), with the config fields it needs."""
        self.reference(**values, **{n: naming.field(cfg, n) for n in self.ref_params})

    def applies(self, cfg: DecodeConfig) -> bool:
        """`cfg`'s model has what the op computes: a GEMV's projection (the MLP's only where the MLP is dense), and a
        library GEMM's bf16 weights."""
        if self.library and cfg.weight_dtype != "bfloat16":
            return False
        proj = self.flags.get("proj") or SPLIT_WIDTHS.get(str(self.flags.get("width")), "")
        return proj in ("", *cfg.model.projections)

    def workload_key(self, cfg: DecodeConfig, target_kind: str) -> str:
        """The workload's name (`naming.workload`): its tuning-log folder and its build's manifest entry."""
        return naming.workload(target_kind, self.key_name or self.name, self.sizes(cfg))

    def definition(self, cfg: DecodeConfig) -> tirx.PrimFunc:
        """The unscheduled PrimFunc, named `main`; marked `IN_PLACE_ATTR` when a state is updated in place."""
        func = self.make(cfg).with_attr("global_symbol", "main")
        if any(a.alias for a in self.signature(cfg)):
            func = func.with_attr(IN_PLACE_ATTR, True)
        return func

    def schedule(self, cfg: DecodeConfig, target_kind: str, **knobs) -> s_tir.Schedule:
        """The hand schedule for `target_kind` applied to a fresh definition."""
        if target_kind not in self.schedules:
            raise KeyError(f"{self.name}: no hand schedule for target {target_kind!r}")
        sch = s_tir.Schedule(self.definition(cfg))
        self.schedules[target_kind](sch, cfg, **knobs)
        return sch


def _dims(*names: str) -> Callable[[DecodeConfig], dict[str, object]]:
    def sizes(cfg: DecodeConfig) -> dict[str, object]:
        return {n: naming.field(cfg, n) for n in names}

    return sizes


def _gemv_sizes(
    cfg: DecodeConfig, proj: str, conv: bool = False, norm: bool = False, rmsnorm: bool = False
) -> dict[str, object]:
    rows, cols = cfg.model.projections[proj]
    sizes: dict[str, object] = {"batch": cfg.batch, "rows": rows, "cols": cols}
    if conv:
        sizes |= _dims("slots", "conv_dim", "conv_kernel")(cfg)
    if norm:
        sizes |= _dims("head_v_dim", "rms_norm_eps")(cfg)
    if rmsnorm:
        sizes |= _dims("rms_norm_eps")(cfg)
    return sizes | _dims("weight_dtype")(cfg)


def _split_sizes(cfg: DecodeConfig, width: str) -> dict[str, object]:
    return {"batch": cfg.batch, "cols": cfg.model.split_cols(width)}


def _gemm_sizes(cfg: DecodeConfig, proj: str) -> dict[str, object]:
    rows, cols = cfg.model.projections[proj]
    parts = {"parts": len(STACKED[proj])} if proj in STACKED else {}
    return {"batch": cfg.batch, "rows": rows, "cols": cols, **parts}


def _entry(
    family: str,
    sizes,
    *,
    name: str = "",
    ref: str = "",
    exact: bool = False,
    key_name: str = "",
    ref_params: tuple[str, ...] = (),
    **flags,
) -> Op:
    op_mod, ref_mod, sched_mod = (import_module(f"gdn_tvm.{pkg}.{family}") for pkg in ("ops", "reference", "schedules"))
    return Op(
        name=name or family,
        family=family,
        make=partial(getattr(op_mod, f"make_{family}"), **flags),
        signature=partial(op_mod.signature, **flags),
        reference=getattr(ref_mod, ref or family),
        schedules={
            kind: partial(getattr(sched_mod, kind), **flags) for kind in TARGET_KINDS if hasattr(sched_mod, kind)
        },
        knobs={kind: getattr(sched_mod, grid, {}) for kind, grid in KNOB_GRIDS.items()},
        sizes=sizes,
        exact=exact,
        key_name=key_name,
        ref_params=ref_params,
        flags=flags,
        library=getattr(op_mod, "LIBRARY", ""),
    )


_ATTN = ("batch", "n_q_heads", "n_kv_heads", "head_dim")
_CACHE = ("batch", "slots", "max_len", "n_q_heads", "n_kv_heads", "head_dim")  # then split_len, kv_dtype
_RECURRENCE = ("batch", "slots", "n_k_heads", "n_v_heads", "head_k_dim", "head_v_dim", "head_mapping", "state_dtype")

_ENTRIES = [
    _entry("causal_conv1d_silu", _dims("batch", "slots", "conv_dim", "conv_kernel", "weight_dtype")),
    _entry(
        "per_head_l2_norm",
        _dims("batch", "conv_dim", "n_k_heads", "head_k_dim", "l2_norm_eps"),
        ref_params=("l2_norm_eps",),
    ),
    _entry("gates", _dims("batch", "n_v_heads")),
    _entry("delta_rule", _dims(*_RECURRENCE), ref_params=("head_mapping", "state_dtype")),
    _entry(
        "delta_rule",
        _dims(*_RECURRENCE, "l2_norm_eps"),
        name="delta_rule_fused",
        ref="delta_rule_fused",
        ref_params=("head_mapping", "state_dtype", "l2_norm_eps"),
        fused=True,
    ),
    _entry(
        "gated_rmsnorm",
        _dims("batch", "n_v_heads", "head_v_dim", "rms_norm_eps", "weight_dtype"),
        ref_params=("rms_norm_eps",),
    ),
    _entry("split_interleaved", _dims("batch", "n_q_heads", "head_dim"), exact=True),
    _entry("per_head_rmsnorm", _dims(*_ATTN, "rms_norm_eps", "weight_dtype"), ref_params=("rms_norm_eps",)),
    _entry(
        "partial_neox_rope", _dims(*_ATTN, "n_rot", "rope_theta"), ref_params=("rope_theta", "partial_rotary_factor")
    ),
    _entry(
        "kv_row_scatter",
        _dims("batch", "slots", "max_len", "n_kv_heads", "head_dim", "kv_dtype"),
        exact=True,
        ref_params=("kv_dtype",),
    ),
    _entry(
        "attention_prologue",
        _dims(*_CACHE, "n_rot", "rope_theta", "rms_norm_eps", "weight_dtype", "kv_dtype"),
        ref_params=("rms_norm_eps", "rope_theta", "partial_rotary_factor", "kv_dtype"),
    ),
    _entry("decode_attention", _dims(*_CACHE, "split_len", "kv_dtype")),
    _entry(
        "decode_attention",
        _dims(*_CACHE, "split_len", "kv_dtype"),
        name="decode_attention_split",
        ref="decode_attention_split",
        ref_params=("split_len",),
        split=True,
    ),
    _entry(
        "decode_attention_reduce",
        _dims("batch", "n_q_heads", "head_dim", "split_len", "n_splits"),
        ref_params=("split_len",),
    ),
    _entry("sigmoid_gate", _dims("batch", "n_q_heads", "head_dim")),
    _entry("embedding", _dims("batch", "vocab_size", "hidden", "weight_dtype"), exact=True),
    _entry("add_rmsnorm", _dims("batch", "hidden", "rms_norm_eps", "weight_dtype"), ref_params=("rms_norm_eps",)),
    _entry(
        "add_rmsnorm",
        _dims("batch", "hidden", "rms_norm_eps", "weight_dtype"),
        name="rmsnorm",
        ref="rmsnorm",
        ref_params=("rms_norm_eps",),
        add=False,
    ),
    _entry("swiglu", _dims("batch", "intermediate_size"), proj="gate_up_proj"),
    *(
        _entry(
            "split_bf16",
            partial(_split_sizes, width=width),
            name=f"split_bf16_{width}",
            exact=True,
            key_name="split_bf16",
            width=width,
        )
        for width in SPLIT_WIDTHS
    ),
    *(
        _entry("gemm", partial(_gemm_sizes, proj=proj), name=f"gemm_{proj}", key_name="gemm", proj=proj)
        for proj in (*LIBRARY_GEMMS, *STACKED)
    ),
    _entry("sample", _dims("batch", "vocab_size"), exact=True),
    _entry("argmax", _dims("batch", "vocab_size"), exact=True),
    _entry("advance", _dims("batch", "max_len"), exact=True),
    *(
        _entry(
            "gemv",
            partial(_gemv_sizes, proj=proj, conv=True),
            name=f"gemv_{proj}_conv",
            ref="gemv_conv",
            key_name="gemv_conv",
            proj=proj,
            conv=True,
        )
        for proj in ("in_proj_qkv", "in_proj")
    ),
    _entry(
        "gemv",
        partial(_gemv_sizes, proj="out_proj", norm=True),
        name="gemv_out_proj_norm",
        ref="gemv_norm",
        key_name="gemv_norm",
        ref_params=("rms_norm_eps",),
        proj="out_proj",
        norm=True,
    ),
    _entry(
        "gemv",
        partial(_gemv_sizes, proj="gate_up_proj"),
        name="gemv_gate_up_proj_swiglu",
        ref="gemv_swiglu",
        key_name="gemv_swiglu",
        proj="gate_up_proj",
        swiglu=True,
    ),
    # the decoder layer's RMSNorm as the prologue of the GEMVs reading the residual stream, its residual add as the
    # epilogue of those writing a sublayer's output (plan.Fusions.block_stages)
    _entry(
        "gemv",
        partial(_gemv_sizes, proj="in_proj", conv=True, rmsnorm=True),
        name="gemv_in_proj_rmsnorm_conv",
        ref="gemv_rmsnorm_conv",
        key_name="gemv_rmsnorm_conv",
        ref_params=("rms_norm_eps",),
        proj="in_proj",
        rmsnorm=True,
        conv=True,
    ),
    _entry(
        "gemv",
        partial(_gemv_sizes, proj="qkv_proj", rmsnorm=True),
        name="gemv_qkv_proj_rmsnorm",
        ref="gemv_rmsnorm",
        key_name="gemv_rmsnorm",
        ref_params=("rms_norm_eps",),
        proj="qkv_proj",
        rmsnorm=True,
    ),
    _entry(
        "gemv",
        partial(_gemv_sizes, proj="gate_up_proj", rmsnorm=True),
        name="gemv_gate_up_proj_rmsnorm_swiglu",
        ref="gemv_rmsnorm_swiglu",
        key_name="gemv_rmsnorm_swiglu",
        ref_params=("rms_norm_eps",),
        proj="gate_up_proj",
        rmsnorm=True,
        swiglu=True,
    ),
    _entry(
        "gemv",
        partial(_gemv_sizes, proj="out_proj", norm=True),
        name="gemv_out_proj_norm_residual",
        ref="gemv_norm_residual",
        key_name="gemv_norm_residual",
        ref_params=("rms_norm_eps",),
        proj="out_proj",
        norm=True,
        residual=True,
    ),
    *(
        _entry(
            "gemv",
            partial(_gemv_sizes, proj=proj),
            name=f"gemv_{proj}_residual",
            ref="gemv_residual",
            key_name="gemv_residual",
            proj=proj,
            residual=True,
        )
        for proj in ("o_proj", "down_proj")
    ),
    *(
        _entry("gemv", partial(_gemv_sizes, proj=proj), name=f"gemv_{proj}", key_name="gemv", proj=proj)
        for proj in (
            "in_proj_qkv",
            "in_proj_z",
            "in_proj_b",
            "in_proj_a",
            "in_proj",
            "out_proj",
            "q_proj",
            "k_proj",
            "v_proj",
            "qkv_proj",
            "o_proj",
            "down_proj",
            "lm_head",
        )
    ),
]

OPS: dict[str, Op] = {op.name: op for op in _ENTRIES}


def get(name: str) -> Op:
    """The registry entry `name`; raises `KeyError` listing the known names."""
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(OPS)}") from None


def workload_groups(cfg: DecodeConfig, target_kind: str, names: Sequence[str]) -> dict[str, list[str]]:
    """The op names of `names` by workload key, in first-seen order: ops of one key share a definition, hence one
    tuning record, one schedule and one compiled function. Library ops on `target_kind` (`Op.compiled`) have none."""
    groups: dict[str, list[str]] = {}
    for name in names:
        if get(name).compiled(target_kind):
            groups.setdefault(get(name).workload_key(cfg, target_kind), []).append(name)
    return groups
