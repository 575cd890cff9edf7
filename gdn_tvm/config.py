"""Model presets and decode shapes: the only home of sizes in gdn_tvm.

`ModelConfig` holds what a checkpoint fixes (heads, head dims, rope); `DecodeConfig` adds what the
serving side chooses (batch lanes, state-pool slots, KV-cache length, split-KV chunk). Every kernel
factory takes a `DecodeConfig` and reads its sizes from here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

HEAD_MAPPINGS = ("grouped", "tiled")
# Storage dtypes of what a step streams (`DecodeConfig.weight_dtype`, `kv_dtype`, `state_dtype`), each with its short
# name in artifact names; kernels compute in float32 whatever they load.
DTYPES = {"float32": "f32", "bfloat16": "bf16"}
# The positive normal float32 numbers: the range of a constant the kernels hold as a float32 literal (rope_theta, the
# epsilons), where it neither overflows nor flushes to zero.
FLOAT32_NORMAL = (2.0**-126, float.fromhex("0x1.fffffep+127"))

# Input projections stacked row-wise into one weight (one GEMV launch where a step uses them: B = 1), in order.
STACKED = {
    "in_proj": ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"),
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
}

# Batched projections as library GEMMs (`plan.Fusions.library_gemm`): `gemm_<proj>` for each of `LIBRARY_GEMMS` (every
# projection a step does not stack), reading its input split into two bf16 rows by `split_bf16_<width>`; a width is
# named by the projection whose input defines it, the rest read the residual stream's ("hidden").
LIBRARY_GEMMS = (
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "out_proj",
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_up_proj",
    "down_proj",
    "lm_head",
)
SPLIT_WIDTHS = {"hidden": "in_proj_qkv", "value": "out_proj", "attention": "o_proj", "intermediate": "down_proj"}


def split_width(proj: str) -> str:
    """The `SPLIT_WIDTHS` name of `proj`'s input."""
    return next((width for width, owner in SPLIT_WIDTHS.items() if owner == proj), "hidden")


def float32_normal(x: float) -> bool:
    """`x` is in `FLOAT32_NORMAL`: a kernel constant that neither overflows nor flushes to zero."""
    return FLOAT32_NORMAL[0] <= x <= FLOAT32_NORMAL[1]


def rotary_problem(head_dim: int, partial_rotary_factor: float) -> str | None:
    """Why a head of `head_dim` dims cannot rotate that fraction of them (RoPE rotates pairs of dims: the count,
    `ModelConfig.n_rot`, must be even and at least 2), or None."""
    n_rot = int(head_dim * partial_rotary_factor)
    if n_rot < 2 or n_rot % 2:
        return (
            f"head_dim={head_dim} x {partial_rotary_factor!r} rotates {n_rot} dims a head; RoPE rotates pairs of "
            "dims, so that must be even and at least 2"
        )
    return None


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of a Gated DeltaNet hybrid model (Qwen3.5 / Qwen3-Next), per docs/math.md."""

    name: str
    hidden: int
    n_layers: int
    n_q_heads: int  # Hq, full attention
    n_kv_heads: int  # Hkv, full attention
    n_k_heads: int  # Hk, GDN
    n_v_heads: int  # Hv, GDN
    head_k_dim: int = 128  # Dk
    head_v_dim: int = 128  # Dv
    conv_kernel: int = 4  # Kc
    head_dim: int = 256  # D, full attention
    partial_rotary_factor: float = 0.25
    rope_theta: float = 1e7
    rms_norm_eps: float = 1e-6
    l2_norm_eps: float = 1e-6  # L2 norm of q and k: not in the HF config; HF and fla hard-code 1e-6 in their l2norm
    full_attention_interval: int = 4
    head_mapping: str = "grouped"
    vocab_size: int = 248320  # rows of the embedding and the LM head (Qwen3.5's tokenizer, padded)
    tie_word_embeddings: bool = False  # the LM head is the embedding table (no lm_head tensor in the checkpoint)
    intermediate_size: int | None = None  # dense SwiGLU MLP width; None where every MLP is mixture-of-experts

    def __post_init__(self) -> None:
        if self.head_mapping not in HEAD_MAPPINGS:
            raise ValueError(f"head_mapping must be one of {HEAD_MAPPINGS}, got {self.head_mapping!r}")
        if self.n_v_heads % self.n_k_heads:
            raise ValueError(f"n_v_heads={self.n_v_heads} is not a multiple of n_k_heads={self.n_k_heads}")
        if self.n_q_heads % self.n_kv_heads:
            raise ValueError(f"n_q_heads={self.n_q_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        for name in ("vocab_size", "intermediate_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if problem := rotary_problem(self.head_dim, self.partial_rotary_factor):
            raise ValueError(f"partial_rotary_factor: {problem}")
        for name in ("rope_theta", "rms_norm_eps", "l2_norm_eps"):  # float32 literals in the kernels
            if not float32_normal(getattr(self, name)):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a positive float32 normal number")

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN conv: `2*Hk*Dk + Hv*Dv` in `[q | k | v]` order."""
        return 2 * self.n_k_heads * self.head_k_dim + self.n_v_heads * self.head_v_dim

    @property
    def n_rot(self) -> int:
        """Rotated dims per attention head."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def layer_types(self) -> tuple[str, ...]:
        """`"attention"` for layer i iff `(i + 1) % full_attention_interval == 0`, else `"gdn"`."""
        k = self.full_attention_interval
        return tuple("attention" if (i + 1) % k == 0 else "gdn" for i in range(self.n_layers))

    @property
    def projections(self) -> dict[str, tuple[int, int]]:
        """GEMV weights `[out, in]` by checkpoint name: the two mixers' (`linear_attn.` / `self_attn.`), then the
        concatenations of `STACKED` (the input projections of a mixer as one GEMV), the dense MLP's where
        `intermediate_size` is set (`gate_up_proj`: `mlp.gate_proj`'s rows, then `mlp.up_proj`'s, as one weight;
        `mlp.down_proj`) and `lm_head`."""
        hv_dv, d = self.n_v_heads * self.head_v_dim, self.head_dim
        named = {
            "in_proj_qkv": (self.conv_dim, self.hidden),
            "in_proj_z": (hv_dv, self.hidden),
            "in_proj_b": (self.n_v_heads, self.hidden),
            "in_proj_a": (self.n_v_heads, self.hidden),
            "out_proj": (self.hidden, hv_dv),
            "q_proj": (self.n_q_heads * 2 * d, self.hidden),
            "k_proj": (self.n_kv_heads * d, self.hidden),
            "v_proj": (self.n_kv_heads * d, self.hidden),
            "o_proj": (self.hidden, self.n_q_heads * d),
        }
        for name, parts in STACKED.items():
            named[name] = (sum(named[p][0] for p in parts), self.hidden)
        if self.intermediate_size is not None:
            named["gate_up_proj"] = (2 * self.intermediate_size, self.hidden)
            named["down_proj"] = (self.hidden, self.intermediate_size)
        named["lm_head"] = (self.vocab_size, self.hidden)
        return named

    def split_cols(self, width: str) -> int:
        """K of activation width `width` (`SPLIT_WIDTHS`): the input width of the projection naming it."""
        return self.projections[SPLIT_WIDTHS[width]][1]

    def stop_ids_problem(self, ids: list[int]) -> str | None:
        """Why `ids` cannot be this model's stop-token list (more than `STOP_IDS` of them, or one outside the
        vocabulary), or None."""
        if len(ids) > STOP_IDS or not all(0 <= i < self.vocab_size for i in ids):
            return f"expected at most {STOP_IDS} ids in [0, {self.vocab_size})"
        return None

    def key_head(self, h: int) -> int:
        """GDN key/query head that value head `h` reads."""
        if self.head_mapping == "grouped":
            return h // (self.n_v_heads // self.n_k_heads)
        return h % self.n_k_heads


STOP_IDS = 8  # entries of a model step's stop-token list (a model's EOS ids, padded with -1)
ARGMAX_CHUNKS, ARGMAX_MIN_CHUNK = 256, 64  # `argmax`'s first stage: chunks of a row at most, logits a chunk at least
# `sample`'s search launches: a CTA a chunk of a lane's row, each reading its lane's C chunk sums (B C^2 a launch):
# C at most SAMPLE_CHUNKS and B C^2 at most SAMPLE_SUMS (chunks of at least ARGMAX_MIN_CHUNK logits)
SAMPLE_CHUNKS, SAMPLE_SUMS = 256, 65536
# `sample`'s threshold searches: bits of a logit's order key, and those a step fixes (a launch a step; it tries
# 2^SEARCH_DIGIT_BITS - 1 thresholds)
KEY_BITS, SEARCH_DIGIT_BITS = 32, 2
DTYPE_FIELDS = ("weight_dtype", "kv_dtype", "state_dtype")  # the `DecodeConfig` fields holding a `DTYPES` name


@dataclass(frozen=True)
class DecodeConfig:
    """One decode step's shapes: the model plus serving choices.

    batch: lanes decoded together (B); slots: size of every state pool (conv, recurrent, KV);
    max_len: KV-cache rows per slot; split_len: positions per split-KV chunk.
    Storage dtypes (`DTYPES`): weight_dtype of the projection, conv and norm weights (the gates' A and dt_bias
    stay float32); kv_dtype of the KV caches; state_dtype of the recurrent state. By default bf16 weights and KV
    caches, as checkpoints ship and engines stream them, and a float32 recurrent state, as transformers keeps it.
    Activations and conv states are float32.
    """

    model: ModelConfig
    batch: int = 1
    slots: int = 0  # 0 => same as batch
    max_len: int = 4096
    split_len: int = 128
    weight_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    state_dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.slots == 0:
            object.__setattr__(self, "slots", self.batch)
        for field in ("batch", "slots", "max_len", "split_len"):  # the kernels index with int32
            if not 1 <= getattr(self, field) < 2**31:
                raise ValueError(f"{field} must be in [1, 2**31), got {getattr(self, field)}")
        if self.slots < self.batch:
            raise ValueError(f"slots={self.slots} must be >= batch={self.batch}")
        for field in DTYPE_FIELDS:
            if getattr(self, field) not in DTYPES:
                raise ValueError(f"{field} must be one of {tuple(DTYPES)}, got {getattr(self, field)!r}")
        m = self.model  # arrays the kernels index with int32 (the KV caches' are int64)
        for field, what, elements in (
            ("batch", "the logits", self.batch * m.vocab_size),
            ("slots", "the recurrent state pool", self.slots * m.n_v_heads * m.head_v_dim * m.head_k_dim),
            ("slots", "the conv state pool", self.slots * m.conv_dim * (m.conv_kernel - 1)),
        ):
            if elements >= 2**31:
                raise ValueError(
                    f"{field}={getattr(self, field)}: {what} would hold {elements} elements, past the 2**31 the "
                    "kernels index with int32"
                )

    @property
    def n_splits(self) -> int:
        """Split-KV chunks covering `max_len`."""
        return math.ceil(self.max_len / self.split_len)

    @property
    def argmax_chunks(self) -> int:
        """Chunks C of a lane's logits in `argmax`'s first stage, each of `ceil(V / C)` but the last (none empty):
        ARGMAX_CHUNKS in a long row (256 of 970 at V = 248,320), fewer of about ARGMAX_MIN_CHUNK in a short one."""
        V = self.model.vocab_size
        return math.ceil(V / max(ARGMAX_MIN_CHUNK, math.ceil(V / ARGMAX_CHUNKS)))

    @property
    def sample_chunks(self) -> int:
        """Chunks C of a lane's logits in `sample`'s search launches (a CTA each), each of `ceil(V / C)` but the last
        (none empty): the largest power of two with B C^2 <= SAMPLE_SUMS, at most SAMPLE_CHUNKS (256 at B = 1, 64 at B
        = 8, 32 at B = 32, 16 at B = 128: the best of 16-256 on the H200, `h200_sampling_chunks.json`), fewer in a
        short row."""
        V = self.model.vocab_size
        chunks = min(SAMPLE_CHUNKS, 1 << (max(1, math.isqrt(SAMPLE_SUMS // self.batch)).bit_length() - 1))
        return math.ceil(V / max(ARGMAX_MIN_CHUNK, math.ceil(V / chunks)))

    @property
    def sample_workspace(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """`sample`'s workspace, name -> (shape, dtype), what each launch of its chain leaves for the next (C =
        `sample_chunks` chunks a lane, S = KEY_BITS / SEARCH_DIGIT_BITS search steps, G = 2^SEARCH_DIGIT_BITS - 1
        tries a step): chunk_max and chunk_first (each chunk's largest logit and its first index), counts and masses
        (each chunk's part of a search step's sums: the tries' counts packed in one word, masses per try), kth and pth
        (each chunk's copy of a threshold before each step), zk_part and kept_part (each chunk's candidates' and kept
        tokens' weight), kept_after (the row's tokens after the chunk's last kept one), lane_max and lane_zk (each
        chunk's copy of the row's largest logit and of the candidates' weight)."""
        B, C, S, G = self.batch, self.sample_chunks, KEY_BITS // SEARCH_DIGIT_BITS, 2**SEARCH_DIGIT_BITS - 1
        return {
            "chunk_max": ((B, C), "float32"),
            "chunk_first": ((B, C), "int32"),
            "counts": ((B, S + 1, C), "uint64"),
            "kth": ((B, S + 1, C), "uint32"),
            "zk_part": ((B, C), "float64"),
            "lane_max": ((B, C), "float32"),
            "masses": ((B, S + 1, C, G), "float64"),
            "pth": ((B, S + 1, C), "uint32"),
            "lane_zk": ((B, C), "float64"),
            "kept_part": ((B, C), "float64"),
            "kept_after": ((B, C), "int32"),
        }

    def replace(self, **changes) -> DecodeConfig:
        """A copy with some fields changed (`model` fields are accepted too)."""
        model_fields = {f.name for f in dataclasses.fields(ModelConfig)}
        model_changes = {k: changes.pop(k) for k in list(changes) if k in model_fields}
        model = dataclasses.replace(self.model, **model_changes) if model_changes else self.model
        return dataclasses.replace(self, model=model, **changes)


# Sizes from each model's Hugging Face `config.json` (Qwen3.5 nests them under `text_config`) and model card; where
# each value was read is in docs/math.md ("Model shapes"). The -a3b presets' MLPs are mixture-of-experts: no
# `intermediate_size` (outside this project).
PRESETS: dict[str, ModelConfig] = {
    m.name: m
    for m in (
        ModelConfig(
            "qwen3.5-0.8b", hidden=1024, n_layers=24, n_q_heads=8, n_kv_heads=2, n_k_heads=16, n_v_heads=16,
            intermediate_size=3584, tie_word_embeddings=True,
        ),
        ModelConfig(
            "qwen3.5-4b", hidden=2560, n_layers=32, n_q_heads=16, n_kv_heads=4, n_k_heads=16, n_v_heads=32,
            intermediate_size=9216, tie_word_embeddings=True,
        ),
        ModelConfig(
            "qwen3.5-9b", hidden=4096, n_layers=32, n_q_heads=16, n_kv_heads=4, n_k_heads=16, n_v_heads=32,
            intermediate_size=12288,
        ),
        ModelConfig(
            "qwen3.5-27b", hidden=5120, n_layers=64, n_q_heads=24, n_kv_heads=4, n_k_heads=16, n_v_heads=48,
            intermediate_size=17408,
        ),
        ModelConfig(
            "qwen3.5-35b-a3b", hidden=2048, n_layers=40, n_q_heads=16, n_kv_heads=2, n_k_heads=16, n_v_heads=32
        ),
        ModelConfig(
            "qwen3-next-80b-a3b", hidden=2048, n_layers=48, n_q_heads=16, n_kv_heads=2, n_k_heads=16, n_v_heads=32,
            vocab_size=151936,
        ),
    )
}  # fmt: skip

DEFAULT_PRESET = "qwen3.5-0.8b"


def preset(name: str) -> ModelConfig:
    """The named preset; raises `KeyError` listing the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        raise KeyError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
