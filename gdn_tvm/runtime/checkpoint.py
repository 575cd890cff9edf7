"""Load a Hugging Face Qwen3.5 / Qwen3-Next checkpoint directory: every weight of the text model, in kernel layouts.

Reads `config.json` (sizes, rope_theta, the layer pattern, the MLP width, the vocabulary, the LM head's tying) and
`*.safetensors` by the checkpoint's own parameter names (docs/math.md, "Checkpoint names"), under
`model.language_model.` (Qwen3.5's released multimodal checkpoints) or `model.` (text-only ones, Qwen3-Next), and
`lm_head.weight` at the top level; the vision tower (`model.visual.*`) and the MTP head (`mtp.*`) are not read. It
converts: `A = -exp(A_log)`, the conv weight `[C, 1, Kc]` squeezed, Qwen3-Next's fused `in_proj_qkvz` /
`in_proj_ba` split into the four GDN projections in `[q | k | v]` channel order. The zero-centred RMSNorm weights
(q/k norms, the layer norms, the final norm) stay as stored: the kernels add the 1 in float32. A tied LM head is the
embedding array itself (no second copy; an `lm_head.weight` in the files is then not read, as Hugging Face ties it
over). Mixture-of-experts MLPs are not read. The head mapping is "grouped". Each weight is returned in its stored
dtype at the requested `weight_dtype` (`plan.stored_dtype`): a bf16 tensor stays bf16 for a bf16 stack (no upcast),
anything else is rounded once, after any conversion, to that dtype.

Everything read is checked, and a checkpoint that fails a check raises `CheckpointError`, whose message starts with
the file at fault (`config.json`, a `.safetensors` shard, or `<dir>/*.safetensors` for the shards together) and
names the field or tensor: config fields by type and range, shards by the safetensors library's own validation
(it refuses a truncated, padded, empty or random file, and a header that is not JSON or whose offsets do not tile
the data exactly), tensors read by dtype (floating only), shape and value (finite as stored weights). A tensor in
two shards is refused. Where `model.safetensors.index.json` is present, the shards it names are read (others in the
folder are not), each of which must exist. Tensors the loader does not read (vision tower, MTP head) are not checked.
"""

from __future__ import annotations

import dataclasses
import json
import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, the dtype of real Qwen checkpoints)
import numpy as np
from safetensors import SafetensorError, safe_open

from gdn_tvm.config import DTYPES, PRESETS, ModelConfig, float32_normal, rotary_problem
from gdn_tvm.plan import WEIGHTS, block_weights, model_weights, stored_dtype
from gdn_tvm.signature import ArgumentError

PREFIXES = ("model.language_model.layers.", "model.layers.")
INDEX = "model.safetensors.index.json"  # where present, the shards it names are the checkpoint's (as in transformers)
FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors dtype names the loader reads
# ModelConfig field -> config.json field, each an integer >= 1
SIZES = {
    "hidden": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_q_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "n_k_heads": "linear_num_key_heads",
    "n_v_heads": "linear_num_value_heads",
    "head_k_dim": "linear_key_head_dim",
    "head_v_dim": "linear_value_head_dim",
    "conv_kernel": "linear_conv_kernel_dim",
    "head_dim": "head_dim",
}
MULTIPLES = (("linear_num_value_heads", "linear_num_key_heads"), ("num_attention_heads", "num_key_value_heads"))
LAYER_TYPES = {"linear_attention": "gdn", "full_attention": "attention"}
_REQUIRED = object()  # `_Section.get`'s default: the field must be present


class CheckpointError(ArgumentError):
    """A checkpoint file failed a check; the message starts with the file and names the field or tensor."""


class _Section:
    """One JSON object of config.json; every error names the file and the field's dotted path (`text_config.x`)."""

    def __init__(self, obj: object, file: str, path: str = ""):
        self.file, self.path = file, path
        if not isinstance(obj, dict):
            raise self.error("", f"expected a JSON object, got {reprlib.repr(obj)}")
        self.obj = obj

    def error(self, key: str, why: str) -> CheckpointError:
        field = self.path + key if key else self.path.rstrip(".")
        return CheckpointError(f"{self.file}: {field}: {why}" if field else f"{self.file}: {why}")

    def get(self, key: str, default: object = _REQUIRED) -> object:
        if key not in self.obj and default is _REQUIRED:
            raise self.error("", f"missing field {key!r}")
        return self.obj.get(key, default)

    def section(self, key: str) -> _Section | None:
        """The object under `key`, or None where the field is absent or null."""
        value = self.obj.get(key)
        return None if value is None else _Section(value, self.file, f"{self.path}{key}.")

    def size(self, key: str, default: object = _REQUIRED) -> int:
        """An integer in [1, 2^31) (not a bool, not 64.0): the kernels index with int32."""
        value = self.get(key, default)
        if type(value) is not int or not 1 <= value < 2**31:
            raise self.error(key, f"expected an integer in [1, 2^31), got {reprlib.repr(value)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean."""
        value = self.get(key, default)
        if type(value) is not bool:
            raise self.error(key, f"expected true or false, got {reprlib.repr(value)}")
        return value

    def number(self, key: str, ok: Callable[[float], bool], want: str, default: object = _REQUIRED) -> float:
        """A JSON number (int or float, not a bool) for which `ok` holds; `want` says what `ok` asks."""
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not ok(_to_float(value)):
            raise self.error(key, f"expected a number {want}, got {reprlib.repr(value)}")
        return float(value)


def _to_float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond float64
        return math.inf


def _fraction(x: float) -> bool:
    return 0 < x <= 1


def _rope_field(c: _Section, key: str, ok: Callable[[float], bool], want: str) -> float:
    """rope_theta or partial_rotary_factor (no default: HF's differs between model classes), from the first non-empty
    object of `rope_parameters` (Qwen3.5) and `rope_scaling`, else from the top level (Qwen3-Next)."""
    rope = next((s for s in map(c.section, ("rope_parameters", "rope_scaling")) if s is not None and s.obj), c)
    for section in (rope, c):
        if key in section.obj:
            return section.number(key, ok, want)
    raise c.error("", f"missing field {key!r} (top level or in rope_parameters)")


def _intermediate_size(c: _Section) -> int | None:
    """The dense MLP's width, or None where the MLPs are mixture-of-experts (`num_experts` >= 1: the -a3b models and
    Qwen3-Next, whose `intermediate_size` no layer uses)."""
    experts = c.get("num_experts", 0)
    if type(experts) is not int or experts < 0:
        raise c.error("num_experts", f"expected an integer >= 0, got {reprlib.repr(experts)}")
    return None if experts else c.size("intermediate_size")


def model_config(config: object, name: str, file: str = "config.json") -> ModelConfig:
    """A `ModelConfig` from a Hugging Face config dict (Qwen3.5 nests it under `text_config`), named after the preset
    of the same sizes if there is one (so `make build --preset` modules load for it), else `name`. Raises
    `CheckpointError` naming `file` and the field for a missing field, a wrong type or a value out of range.

    `tie_word_embeddings` is read where Hugging Face reads it, at the file's top level (the multimodal config's own
    flag, not its text_config's), with its default, false."""
    top = _Section(config, file)
    c = top.section("text_config") or top
    sizes: dict[str, Any] = {ours: c.size(theirs) for ours, theirs in SIZES.items()}
    sizes |= {"vocab_size": c.size("vocab_size"), "intermediate_size": _intermediate_size(c)}
    for multiple, of in MULTIPLES:
        if c.obj[multiple] % c.obj[of]:
            raise c.error(multiple, f"{c.obj[multiple]} is not a multiple of {of}={c.obj[of]}")
    float32 = "that is a positive float32 normal number"
    theta = _rope_field(c, "rope_theta", float32_normal, float32)
    rotary = _rope_field(c, "partial_rotary_factor", _fraction, "in (0, 1]")
    if problem := rotary_problem(sizes["head_dim"], rotary):
        raise c.error("partial_rotary_factor", problem)
    m = ModelConfig(
        name=name,
        **sizes,
        rope_theta=theta,
        partial_rotary_factor=rotary,
        rms_norm_eps=c.number("rms_norm_eps", float32_normal, float32, default=1e-6),
        full_attention_interval=c.size("full_attention_interval", default=4),
        tie_word_embeddings=top.flag("tie_word_embeddings", False),
    )
    _check_layer_types(c, m)
    _check_computation(c)
    return next((p for p in PRESETS.values() if dataclasses.replace(p, name=name) == m), m)


def _check_computation(c: _Section) -> None:
    """Fields that would change what the model computes into something the kernels do not compute: another MLP
    activation, a scaled rotary embedding, biased attention projections."""
    act = c.get("hidden_act", "silu")
    if act != "silu":
        raise c.error("hidden_act", f"the MLP's activation here is SiLU, got {reprlib.repr(act)}")
    for rope in filter(None, map(c.section, ("rope_parameters", "rope_scaling"))):
        kind = rope.get("rope_type", rope.get("type", "default"))
        if kind != "default":
            raise rope.error("rope_type", f"only the unscaled rotary embedding is computed, got {reprlib.repr(kind)}")
    if c.flag("attention_bias", False):
        raise c.error("attention_bias", "the attention projections here have no bias, got true")


def _check_layer_types(c: _Section, m: ModelConfig) -> None:
    """`layer_types`, where given, must be `n_layers` of `LAYER_TYPES` in `full_attention_interval`'s pattern."""
    types = c.get("layer_types", None)
    if types is None:
        return
    names = types if isinstance(types, list) and all(isinstance(t, str) for t in types) else None
    if names is None or len(names) != m.n_layers or not set(names) <= LAYER_TYPES.keys():
        want = f"a list of num_hidden_layers={m.n_layers} of {list(LAYER_TYPES)}"
        raise c.error("layer_types", f"expected {want}, got {reprlib.repr(types)}")
    if tuple(LAYER_TYPES[t] for t in names) != m.layer_types:
        interval = m.full_attention_interval
        raise c.error("layer_types", f"{reprlib.repr(types)} do not follow full_attention_interval={interval}")


def _read_config(file: Path) -> object:
    """config.json's JSON value (any JSON value: `model_config` checks it)."""
    if not file.is_file():
        raise CheckpointError(f"{file}: no such file")
    try:
        return json.loads(file.read_bytes())
    except (OSError, ValueError, RecursionError) as e:  # ValueError: not JSON, not UTF-8, an int of > 4300 digits
        raise CheckpointError(f"{file}: not a JSON file ({e})") from None


def stop_ids(path: str | Path, m: ModelConfig) -> list[int]:
    """A checkpoint directory's EOS token ids: `generation_config.json`'s, else `config.json`'s (each file's own
    `eos_token_id`, else its `text_config`'s; an int or a list of ints that `m` can stop on: `stop_ids_problem`),
    [] where neither names one; `CheckpointError` naming the file and field where one is not JSON or holds anything
    else."""
    for name in ("generation_config.json", "config.json"):
        file = Path(path) / name
        if not file.exists():
            continue
        top = _Section(_read_config(file), str(file))
        text = top.section("text_config")
        for c in (top, text) if text else (top,):
            eos = c.obj.get("eos_token_id")
            if eos is not None:
                ids = eos if isinstance(eos, list) else [eos]
                if not all(type(i) is int for i in ids):
                    raise c.error("eos_token_id", f"expected an int or a list of ints, got {reprlib.repr(eos)}")
                if problem := m.stop_ids_problem(ids):
                    raise c.error("eos_token_id", f"{problem}, got {reprlib.repr(eos)}")
                return ids
    return []


def _open(file: Path) -> safe_open:
    """A safetensors handle on `file`, its header validated (offsets tile the data, which ends at the file's end)."""
    if not file.is_file():
        raise CheckpointError(f"{file}: not a file")
    try:
        return safe_open(file, framework="numpy")
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file}: not a valid safetensors file ({e})") from None


def _indexed_shards(index: Path) -> list[Path]:
    """The shards an index file's `weight_map` names (tensor name -> shard file name in the index's folder), each a
    file: `CheckpointError` naming the index and what is wrong."""
    weight_map = _Section(_read_config(index), str(index)).get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map: expected an object of tensor -> shard file name")
    shards = []
    for name in sorted(set(weight_map.values())):
        shard = index.parent / name
        if Path(name).name != name or not shard.is_file():
            raise CheckpointError(f"{index}: weight_map names {name!r}, which is not a file beside it")
        shards.append(shard)
    return shards


class _Tensors:
    """The tensors of a checkpoint's `*.safetensors` shards, by name, memory-mapped and read when asked for."""

    def __init__(self, path: Path, weight_dtype: str):
        self.files, self.weight_dtype = f"{path}/*.safetensors", weight_dtype
        self._where: dict[str, tuple[Path, safe_open]] = {}  # tensor name -> (shard, its safetensors handle)
        for file in _indexed_shards(path / INDEX) if (path / INDEX).exists() else sorted(path.glob("*.safetensors")):
            handle = _open(file)
            for key in handle.keys():
                if key in self._where:
                    raise CheckpointError(f"{self._where[key][0]}, {file}: both hold tensor {key}")
                self._where[key] = (file, handle)
        if not self._where:
            raise CheckpointError(f"{self.files}: no such files (or no tensors in them)")
        prefix = next((p for p in PREFIXES if any(k.startswith(p) for k in self._where)), None)
        if prefix is None:
            raise CheckpointError(f"{self.files}: no tensor name starts with one of {PREFIXES}")
        self.prefix = prefix
        self.model = prefix.removesuffix("layers.")  # the text model's own tensors: embedding, final norm
        layers = (k[len(prefix) :].split(".", 1)[0] for k in self._where if k.startswith(prefix))
        self.n_layers = 1 + max((int(i) for i in layers if i.isdigit()), default=-1)  # 1 + the highest layer index

    def has(self, layer: int, name: str) -> bool:
        return f"{self.prefix}{layer}.{name}" in self._where

    def get(
        self,
        layer: int,
        name: str,
        shape: tuple[int, ...],
        weight: str,
        convert: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> np.ndarray:
        """`read` of the layer's tensor `<prefix><layer>.<name>`."""
        return self.read(f"{self.prefix}{layer}.{name}", shape, weight, convert)

    def read(
        self, key: str, shape: tuple[int, ...], weight: str, convert: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> np.ndarray:
        """`shape`, in the stored dtype of kernel weight `weight`: tensor `key`, of a floating dtype, through
        `convert` if given (an elementwise map, in float32), and finite."""
        if key not in self._where:
            raise CheckpointError(f"{self.files}: no tensor {key}")
        file, handle = self._where[key]
        info = handle.get_slice(key)
        if info.get_dtype() not in FLOAT_DTYPES:
            raise CheckpointError(f"{file}: tensor {key} has dtype {info.get_dtype()}, expected one of {FLOAT_DTYPES}")
        if tuple(info.get_shape()) != shape:
            raise CheckpointError(f"{file}: tensor {key} has shape {tuple(info.get_shape())}, expected {shape}")
        dtype = stored_dtype(weight, self.weight_dtype)
        with np.errstate(over="ignore"):  # beyond the stored dtype, exp(A_log): refused below as inf
            t = handle.get_tensor(key)
            t = (t if convert is None else convert(t.astype(np.float32))).astype(dtype, copy=False)
        if not np.isfinite(t).all():
            raise CheckpointError(f"{file}: tensor {key} holds NaN or inf (as a {dtype} weight)")
        return t


def _gdn(t: _Tensors, m: ModelConfig, i: int) -> dict[str, np.ndarray]:
    hk, hv, dk, dv, hid = m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim, m.hidden
    w = {}
    if t.has(i, "linear_attn.in_proj_qkvz.weight"):  # Qwen3-Next: per key head [q | k | v (r*Dv) | z (r*Dv)]
        r = hv // hk
        qkvz = t.get(i, "linear_attn.in_proj_qkvz.weight", (hk * (2 * dk + 2 * r * dv), hid), "in_proj_qkv")
        qkvz = qkvz.reshape(hk, 2 * dk + 2 * r * dv, hid)
        q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
        w["in_proj_qkv"] = np.concatenate([x.reshape(-1, hid) for x in (q, k, v)])
        w["in_proj_z"] = z.reshape(-1, hid)
        ba = t.get(i, "linear_attn.in_proj_ba.weight", (2 * hv, hid), "in_proj_b").reshape(hk, 2 * r, hid)
        w["in_proj_b"], w["in_proj_a"] = (x.reshape(-1, hid) for x in np.split(ba, [r], axis=1))
    else:
        for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
            w[name] = t.get(i, f"linear_attn.{name}.weight", m.projections[name], name)
    w["conv1d"] = t.get(i, "linear_attn.conv1d.weight", (m.conv_dim, 1, m.conv_kernel), "conv1d")[:, 0]
    w["dt_bias"] = t.get(i, "linear_attn.dt_bias", (hv,), "dt_bias")
    w["A"] = t.get(i, "linear_attn.A_log", (hv,), "A", lambda a_log: -np.exp(a_log))
    w["norm"] = t.get(i, "linear_attn.norm.weight", (dv,), "norm")
    w["out_proj"] = t.get(i, "linear_attn.out_proj.weight", m.projections["out_proj"], "out_proj")
    return w


def _attention(t: _Tensors, m: ModelConfig, i: int) -> dict[str, np.ndarray]:
    w = {
        name: t.get(i, f"self_attn.{name}.weight", m.projections[name], name)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    for name in ("q_norm", "k_norm"):
        w[name] = t.get(i, f"self_attn.{name}.weight", (m.head_dim,), name)
    return w


def _block(t: _Tensors, m: ModelConfig, i: int) -> dict[str, np.ndarray]:
    shapes = block_weights(m)
    w = {
        name: t.get(i, f"{name}.weight", shapes[name], name) for name in ("input_layernorm", "post_attention_layernorm")
    }
    for name in ("gate_proj", "up_proj", "down_proj"):
        if name in shapes:
            w[name] = t.get(i, f"mlp.{name}.weight", shapes[name], name)
    return w


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint in kernel layouts and stored dtypes. `layers[i]`: layer i's mixer weights (`plan.WEIGHTS`
    of its kind); `blocks[i]`: its norms and dense MLP (`plan.block_weights`); `weights`: the embedding table, final
    norm and LM head (`plan.model_weights`; a tied LM head is the embedding array itself)."""

    model: ModelConfig
    layers: list[dict[str, np.ndarray]]
    blocks: list[dict[str, np.ndarray]]
    weights: dict[str, np.ndarray]

    def arrays(self) -> dict[str, np.ndarray]:
        """Every array by a dotted name (`layers.3.q_proj`, `blocks.0.up_proj`, `lm_head`), the LM head included when
        tied."""
        named = dict(self.weights)
        for part in ("layers", "blocks"):
            for i, layer in enumerate(getattr(self, part)):
                named |= {f"{part}.{i}.{k}": v for k, v in layer.items()}
        return named


def checkpoint_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of a checkpoint directory, from its config.json alone (no tensor read): `CheckpointError`
    naming the file and field where a check fails."""
    cfg_file = Path(path) / "config.json"
    return model_config(_read_config(cfg_file), Path(path).name, str(cfg_file))


def load_checkpoint(path: str | Path, weight_dtype: str = "bfloat16") -> Checkpoint:
    """Every weight of the text model in a checkpoint directory (`Checkpoint`), in their stored dtypes at
    `weight_dtype` (a `config.DTYPES` name); `CheckpointError` (an `ArgumentError`) naming the file and the field or
    tensor where a check fails, `ArgumentError` naming `weight_dtype` for a dtype outside `DTYPES`."""
    if not isinstance(weight_dtype, str) or weight_dtype not in DTYPES:
        raise ArgumentError(f"weight_dtype: expected one of {tuple(DTYPES)}, got {weight_dtype!r}")
    path = Path(path)
    cfg_file = path / "config.json"
    m = checkpoint_config(path)
    tensors = _Tensors(path, weight_dtype)
    if tensors.n_layers != m.n_layers:
        raise CheckpointError(
            f"{cfg_file}: num_hidden_layers={m.n_layers}, but {tensors.files} hold layers 0..{tensors.n_layers - 1}"
        )
    layers = []
    for i, kind in enumerate(m.layer_types):
        w = _gdn(tensors, m, i) if kind == "gdn" else _attention(tensors, m, i)
        assert set(w) == set(WEIGHTS[kind](m)), f"loader and weight table disagree for {kind}"
        layers.append({k: np.ascontiguousarray(v) for k, v in w.items()})
    blocks = [_block(tensors, m, i) for i in range(m.n_layers)]
    shapes = model_weights(m)
    embed = tensors.read(f"{tensors.model}embed_tokens.weight", shapes["embed_tokens"], "embed_tokens")
    norm = tensors.read(f"{tensors.model}norm.weight", shapes["norm"], "norm")
    weights = {"embed_tokens": embed, "norm": norm}
    weights["lm_head"] = (
        embed if m.tie_word_embeddings else tensors.read("lm_head.weight", shapes["lm_head"], "lm_head")
    )
    return Checkpoint(m, layers, blocks, weights)
