"""Load a Hugging Face Qwen3.5 / Qwen3-Next checkpoint directory into mixer weights in kernel layouts.

Reads `config.json` (sizes, rope_theta, the layer pattern) and `*.safetensors` by the checkpoint's own
parameter names (SPEC.md "Checkpoint names") and converts: `A = -exp(A_log)`, q/k norms to `1 + w`,
the conv weight `[C, 1, Kc]` squeezed, Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba` split into the
four GDN projections in `[q | k | v]` channel order. The head mapping is "grouped".
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import ml_dtypes  # noqa: F401  (registers numpy's bfloat16, the dtype of real Qwen checkpoints)
import numpy as np

from gdn_tvm.config import PRESETS, ModelConfig
from gdn_tvm.plan import WEIGHTS
from gdn_tvm.signature import ArgumentError

PREFIXES = ("model.language_model.layers.", "model.layers.")


def model_config(config: dict, name: str) -> ModelConfig:
    """A `ModelConfig` from a Hugging Face config dict (Qwen3.5 nests it under `text_config`), named after the preset
    of the same sizes if there is one (so `make build --preset` modules load for it), else `name`."""
    c = config.get("text_config", config)
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    for key in ("rope_theta", "partial_rotary_factor"):  # no default: HF's differs between model classes
        if key not in rope and key not in c:
            raise ArgumentError(f"config.json: missing field {key!r} (top level or in rope_parameters)")
    try:
        m = ModelConfig(
            name=name,
            hidden=c["hidden_size"],
            n_layers=c["num_hidden_layers"],
            n_q_heads=c["num_attention_heads"],
            n_kv_heads=c["num_key_value_heads"],
            n_k_heads=c["linear_num_key_heads"],
            n_v_heads=c["linear_num_value_heads"],
            head_k_dim=c["linear_key_head_dim"],
            head_v_dim=c["linear_value_head_dim"],
            conv_kernel=c["linear_conv_kernel_dim"],
            head_dim=c["head_dim"],
            partial_rotary_factor=rope.get("partial_rotary_factor", c.get("partial_rotary_factor")),
            rope_theta=float(rope.get("rope_theta", c.get("rope_theta"))),
            rms_norm_eps=c.get("rms_norm_eps", 1e-6),
            full_attention_interval=c.get("full_attention_interval", 4),
        )
    except KeyError as e:
        raise ArgumentError(f"config.json: missing field {e.args[0]!r}") from None
    types = c.get("layer_types")
    if types is not None:
        ours = tuple("attention" if t == "full_attention" else "gdn" for t in types)
        if ours != m.layer_types:
            raise ArgumentError(f"config.json: layer_types {types} do not follow full_attention_interval")
    return next((p for p in PRESETS.values() if dataclasses.replace(p, name=name) == m), m)


class _Tensors:
    """All tensors of the checkpoint's safetensors files, by name, loaded lazily."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self._files = {}
        for f in sorted(path.glob("*.safetensors")):
            handle = safe_open(f, framework="numpy")
            for key in handle.keys():
                self._files[key] = handle
        if not self._files:
            raise ArgumentError(f"checkpoint {path}: no *.safetensors files")
        self.prefix = next((p for p in PREFIXES if any(k.startswith(p) for k in self._files)), None)
        if self.prefix is None:
            raise ArgumentError(f"checkpoint {path}: no tensor starts with one of {PREFIXES}")

    def get(self, layer: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
        key = f"{self.prefix}{layer}.{name}"
        if key not in self._files:
            raise ArgumentError(f"checkpoint: missing tensor {key}")
        t = self._files[key].get_tensor(key)
        if tuple(t.shape) != shape:
            raise ArgumentError(f"checkpoint: tensor {key} has shape {tuple(t.shape)}, expected {shape}")
        return t.astype(np.float32)

    def has(self, layer: int, name: str) -> bool:
        return f"{self.prefix}{layer}.{name}" in self._files


def _gdn(t: _Tensors, m: ModelConfig, i: int) -> dict[str, np.ndarray]:
    hk, hv, dk, dv, hid = m.n_k_heads, m.n_v_heads, m.head_k_dim, m.head_v_dim, m.hidden
    w = {}
    if t.has(i, "linear_attn.in_proj_qkvz.weight"):  # Qwen3-Next: per key head [q | k | v (r*Dv) | z (r*Dv)]
        r = hv // hk
        qkvz = t.get(i, "linear_attn.in_proj_qkvz.weight", (hk * (2 * dk + 2 * r * dv), hid))
        qkvz = qkvz.reshape(hk, 2 * dk + 2 * r * dv, hid)
        q, k, v, z = np.split(qkvz, [dk, 2 * dk, 2 * dk + r * dv], axis=1)
        w["in_proj_qkv"] = np.concatenate([x.reshape(-1, hid) for x in (q, k, v)])
        w["in_proj_z"] = z.reshape(-1, hid)
        ba = t.get(i, "linear_attn.in_proj_ba.weight", (2 * hv, hid)).reshape(hk, 2 * r, hid)
        w["in_proj_b"], w["in_proj_a"] = (x.reshape(-1, hid) for x in np.split(ba, [r], axis=1))
    else:
        for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"):
            w[name] = t.get(i, f"linear_attn.{name}.weight", m.projections[name])
    w["conv1d"] = t.get(i, "linear_attn.conv1d.weight", (m.conv_dim, 1, m.conv_kernel))[:, 0]
    w["dt_bias"] = t.get(i, "linear_attn.dt_bias", (hv,))
    w["A"] = -np.exp(t.get(i, "linear_attn.A_log", (hv,)))
    w["norm"] = t.get(i, "linear_attn.norm.weight", (dv,))
    w["out_proj"] = t.get(i, "linear_attn.out_proj.weight", m.projections["out_proj"])
    return w


def _attention(t: _Tensors, m: ModelConfig, i: int) -> dict[str, np.ndarray]:
    w = {
        name: t.get(i, f"self_attn.{name}.weight", m.projections[name])
        for name in ("q_proj", "k_proj", "v_proj", "o_proj")
    }
    for name in ("q_norm", "k_norm"):
        w[name] = 1.0 + t.get(i, f"self_attn.{name}.weight", (m.head_dim,))
    return w


def load_checkpoint(path: str | Path) -> tuple[ModelConfig, list[dict[str, np.ndarray]]]:
    """(model config, per-layer mixer weights in layer order) from a checkpoint directory."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ArgumentError(f"checkpoint {path}: no config.json")
    m = model_config(json.loads(cfg_file.read_text()), path.name)
    tensors = _Tensors(path)
    layers = []
    for i, kind in enumerate(m.layer_types):
        w = _gdn(tensors, m, i) if kind == "gdn" else _attention(tensors, m, i)
        assert set(w) == set(WEIGHTS[kind](m)), f"loader and weight table disagree for {kind}"
        layers.append({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()})
    return m, layers
