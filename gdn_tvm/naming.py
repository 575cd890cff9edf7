"""The one name function: tuning-log folders, built libraries and their folders, and manifest entries are all named
by `artifact(kind, head, fields)`, from only what the artifact depends on (FlashInfer's URIs, in spirit).

A workload is named by its op's definition and the sizes and storage dtypes its PrimFunc reads (`registry.Op.sizes`),
e.g. `cuda/gemv-f32-B1-N6144-K1024`, or `cuda/gemv-f32-B1-N6144-K1024-wbf16` with bf16 weights; a build by the model,
the serving shapes and dtypes, e.g. `cuda/qwen3.5-0.8b-B1-S1-L4096-sl128-grouped`. A dtype is named only where it is
not `DTYPE` (the `f32` after an op's name), so the names of all-float32 workloads and builds hold no dtype fields.
Pure Python: the runtime names what it loads with it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gdn_tvm.config import DTYPE_FIELDS, DTYPES, DecodeConfig

# Config field -> its short name in artifact names (a value's own text where the short name is empty).
ABBREV = {
    "batch": "B", "slots": "S", "max_len": "L", "split_len": "sl", "n_splits": "n", "hidden": "h", "conv_dim": "C",
    "n_q_heads": "Hq", "n_kv_heads": "Hkv", "n_k_heads": "Hk", "n_v_heads": "Hv", "head_k_dim": "Dk",
    "head_v_dim": "Dv", "head_dim": "D", "conv_kernel": "Kc", "parts": "p", "n_rot": "rot", "rope_theta": "theta",
    "rms_norm_eps": "eps", "l2_norm_eps": "l2eps", "head_mapping": "", "rows": "N", "cols": "K",
    "vocab_size": "V", "intermediate_size": "I", "tie_word_embeddings": "tied",
    "weight_dtype": "w", "kv_dtype": "kv", "state_dtype": "st",
}  # fmt: skip
DTYPE = "float32"  # the dtype of every tensor a name does not name otherwise


def artifact(kind: str, head: str, fields: Mapping[str, object]) -> str:
    """`<kind>/<head>-<field><value>-...`: `fields` in their order, each by its `ABBREV` name; a dtype field
    (`config.DTYPE_FIELDS`) by its short name (`wbf16`), and none at `DTYPE`."""
    named = [
        f"{ABBREV[k]}{DTYPES[str(v)] if k in DTYPE_FIELDS else v}"
        for k, v in fields.items()
        if not (k in DTYPE_FIELDS and v == DTYPE)
    ]
    return "/".join((kind, "-".join([head, *named])))


def field(cfg: DecodeConfig, name: str) -> object:
    """A `DecodeConfig` field or property, else its model's."""
    return getattr(cfg, name) if hasattr(cfg, name) else getattr(cfg.model, name)


def workload(kind: str, definition: str, fields: Mapping[str, object]) -> str:
    """A tuning workload: the definition `definition` (an op, or the family ops of one shape share) at `fields`."""
    return artifact(kind, f"{definition}-{DTYPES[DTYPE]}", fields)


BUILD_FIELDS = ("batch", "slots", "max_len", "split_len", "head_mapping", *DTYPE_FIELDS)


def build(cfg: DecodeConfig, kind: str) -> str:
    """A build of every op of `cfg`'s model at its serving shapes, for target kind `kind`."""
    return artifact(kind, cfg.model.name, {f: field(cfg, f) for f in BUILD_FIELDS})
