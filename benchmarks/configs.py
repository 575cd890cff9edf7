"""The decode configs the GPU benchmarks measure (torch-free, so `benchmarks.prebuild` runs anywhere)."""

from __future__ import annotations

from gdn_tvm import plan
from gdn_tvm.config import DecodeConfig, preset

OP_PRESET = "qwen3.5-4b"
OP_BATCHES = (1, 32, 256)
DELTA_BATCHES = (8, 128)  # the delta rule's other target batches: `--batches 8 128 --ops delta_rule delta_rule_fused`
OP_MAX_LEN = {1: 32768, 8: 8192, 32: 4096, 128: 1024, 256: 1024}  # KV rows per slot, by batch
STEP_PRESETS = ("qwen3.5-0.8b", "qwen3.5-4b")
STEP_BATCHES = (1, 32)
STEP_MAX_LEN = 4096


def op_config(model: str, batch: int, **dtypes: str) -> DecodeConfig:
    """One op-benchmark shape: every lane at the last of `OP_MAX_LEN[batch]` cache rows; `dtypes`: storage dtypes by
    `DecodeConfig` field (default: its defaults)."""
    return DecodeConfig(preset(model), batch=batch, max_len=OP_MAX_LEN.get(batch, 1024), **dtypes)


def step_config(model: str, batch: int, **dtypes: str) -> DecodeConfig:
    """One step-benchmark shape; `dtypes`: storage dtypes by `DecodeConfig` field (default: its defaults)."""
    return DecodeConfig(preset(model), batch=batch, max_len=STEP_MAX_LEN, **dtypes)


# The whole-model benchmark (benchmarks.model): PRESET:BATCH cases at the default storage (bf16 weights and KV cache,
# float32 states).
MODEL_CASES = [f"qwen3.5-0.8b:{b}" for b in (1, 8, 32, 128)] + [f"qwen3.5-4b:{b}" for b in (1, 8, 32, 128)]
MODEL_CASES += ["qwen3.5-9b:1"]
MODEL_MAX_LEN = 4096


def set_library_lanes(lanes: int | None) -> None:
    """Every projection a library GEMM from `lanes` lanes and none below (`plan.LIBRARY_GEMM_LANES` and
    `LIBRARY_GEMM_MIN_LANES`), for a crossover sweep; None keeps the default rule. The plan is derived from them both
    where a model is built and where it is loaded: pass the same value to `benchmarks.prebuild --model` and to
    `benchmarks.model`."""
    if lanes is not None:
        plan.LIBRARY_GEMM_LANES = plan.LIBRARY_GEMM_MIN_LANES = lanes


def model_config(model: str, batch: int, max_len: int = MODEL_MAX_LEN) -> DecodeConfig:
    """One whole-model benchmark shape."""
    return DecodeConfig(preset(model), batch=batch, max_len=max_len)
