"""Shared test pieces: the case table, fresh seeded RNG, the one comparison helper, a build cache."""

from __future__ import annotations

import contextlib
import os
import subprocess
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tvm
from cuda_emu import lower

from gdn_tvm.codegen.compile import compile_op
from gdn_tvm.config import DTYPE_FIELDS, DecodeConfig, preset
from gdn_tvm.plan import model_ops, step_ops
from gdn_tvm.registry import OPS
from gdn_tvm.signature import sample, visible
from gdn_tvm.verify import check_kernel, mismatch

# float32 storage (weights and KV caches), which most tests name: the defaults are bf16 (`DecodeConfig`), whose tests
# are their own (`BF16_CASES`, the dtype-parametrised layer, model and checkpoint tests).
F32 = {"weight_dtype": "float32", "kv_dtype": "float32"}
# Two presets with Hv != Hk among them, B = 1 and B = 3 (4 slots, one lane skipped), a scaled-down cache and
# vocabulary (an embedding table of the real one is 1-5 GB; tests/test_sample.py samples from the whole vocabulary).
CASES = {
    "0.8b-B1": DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=80, split_len=16, **F32).replace(vocab_size=1531),
    "4b-B3": DecodeConfig(preset("qwen3.5-4b"), batch=3, slots=4, max_len=80, split_len=16, **F32).replace(
        vocab_size=997
    ),
    "4b-B1-tiled": DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=48, split_len=32, **F32).replace(
        head_mapping="tiled", vocab_size=2053
    ),
    "27b-B3-tiled": DecodeConfig(preset("qwen3.5-27b"), batch=3, slots=5, max_len=40, split_len=16, **F32).replace(
        head_mapping="tiled", vocab_size=509
    ),
}
# Two of them with bf16 weights, KV caches and recurrent states, for the ops that read a storage dtype (`reads_dtype`).
BF16_CASES = {
    f"{name}-bf16": CASES[name].replace(weight_dtype="bfloat16", kv_dtype="bfloat16", state_dtype="bfloat16")
    for name in ("0.8b-B1", "4b-B3")
}


def reads_dtype(op, cfg: DecodeConfig) -> bool:
    """`op`'s PrimFunc reads a storage dtype of the config (its workload key names one)."""
    return bool(set(op.sizes(cfg)) & set(DTYPE_FIELDS))


class OnCuda(np.ndarray):
    """A host array that reports itself on cuda:0 through DLPack: what a GPU tensor looks like to the checks."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def pytest_report_header(config):
    return f"gdn_tvm seed: {_SEED} (set GDN_TVM_SEED to replay)"


_SEED = int(os.environ.get("GDN_TVM_SEED", np.random.SeedSequence().entropy % 2**32))


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A fresh generator per test, derived from the run's seed and the test id (replayable)."""
    return np.random.default_rng([_SEED, zlib.crc32(request.node.nodeid.encode())])


def assert_close(out: np.ndarray, ref: np.ndarray, tol: float, what: str) -> None:
    """`gdn_tvm.verify.mismatch` as an assertion naming `what`."""
    why = mismatch(out, ref, tol)
    assert why is None, f"{what}: {why}"


def check_op_against_reference(op, cfg, target, rng) -> None:
    """Build `op`'s hand schedule for `target` and check it with `check_kernel_against_reference`."""
    check_kernel_against_reference(op, cfg, compile_op(op, cfg, target), rng)


def check_kernel_against_reference(op, cfg, kernel, rng) -> None:
    """`gdn_tvm.verify.check_kernel` as an assertion: every output and state matches the float64 reference."""
    failed = check_kernel(op, cfg, kernel, rng)
    assert not failed, "; ".join(failed)


def rounding_edges(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 values at bf16's rounding edges: their 16 bits below a bf16 exactly half a bf16 ulp (ties, both
    parities of the bf16 below), one float32 ulp either side of that, or zero; some past bf16's largest finite value
    (they round to inf) and some subnormal."""
    x = rng.standard_normal(shape).astype(np.float32)
    bits = x.view(np.uint32)
    bits[...] = bits & 0xFFFF0000 | rng.choice(np.array([0x8000, 0x7FFF, 0x8001, 0], np.uint32), shape)
    flat = x.reshape(-1)
    flat[:8] = [3.3961e38, -3.3961e38, 3.3895e38, 1e-39, -1e-40, 0.0, -0.0, 1.0 + 2.0**-8]
    return x


def assert_kv_rows_round_to_nearest_even(kernel, cfg: DecodeConfig, rng: np.random.Generator) -> None:
    """`kernel` (kv_row_scatter at `cfg`, bf16 caches) stores rows of `rounding_edges` as numpy (ml_dtypes) rounds
    them to the nearest even bf16, bit for bit, and leaves every other row as it was."""
    args = visible(OPS["kv_row_scatter"].signature(cfg))
    values = {a.name: rounding_edges(a.shape, rng) if a.name in ("k", "v") else sample(a, rng) for a in args}
    tensors = {k: tvm.runtime.tensor(v, tvm.device(*kernel.device)) for k, v in values.items()}
    kernel(**tensors)
    lanes = values["slots"] >= 0
    for name in ("k", "v"):
        expect = values[f"{name}_cache"].copy()
        expect[values["slots"][lanes], values["positions"][lanes]] = values[name][lanes].astype(ml_dtypes.bfloat16)
        got = tensors[f"{name}_cache"].numpy()
        assert np.array_equal(got.view(np.uint16), expect.view(np.uint16)), f"{name}_cache: not rounded to nearest even"


REPO = Path(__file__).resolve().parents[1]
# Ops added after the committed float32 H200 logs (`COMMITTED_CUDA_LOGS`), which hold no record of them.
UNTUNED = (
    "embedding",
    "add_rmsnorm",
    "rmsnorm",
    "sample",
    "argmax",
    "advance",
    "gemv_gate_up_proj_swiglu",
    "gemv_down_proj",
    "gemv_lm_head",
    "gemv_in_proj_rmsnorm_conv",
    "gemv_qkv_proj_rmsnorm",
    "gemv_gate_up_proj_rmsnorm_swiglu",
    "gemv_out_proj_norm_residual",
    "gemv_o_proj_residual",
    "gemv_down_proj_residual",
    "attention_prologue",
)
# The batched steps' library-GEMM path (plan.Fusions.library_gemm: from 16 lanes, none of the committed f32 shapes).
UNTUNED += tuple(name for name, op in OPS.items() if op.family in ("split_bf16", "gemm", "swiglu"))
TUNED = [name for name in OPS if name not in UNTUNED]
CUDA_OPS = {name: op for name, op in OPS.items() if op.compiled("cuda")}  # the rest are library calls there
# The shapes whose every workload of `TUNED` has a committed H200 record (tuning_logs/cuda; `make tune` on the H200).
COMMITTED_CUDA_LOGS = {
    "0.8b-B1": DecodeConfig(preset("qwen3.5-0.8b"), batch=1, **F32),
    "0.8b-B32": DecodeConfig(preset("qwen3.5-0.8b"), batch=32, **F32),
    "4b-B1-32k": DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=32768, **F32),
    "4b-B32": DecodeConfig(preset("qwen3.5-4b"), batch=32, **F32),
}
# The default (bf16) configs whose mixer-step ops (`plan.step_ops`: what `make tune` tunes) all have H200 records.
COMMITTED_BF16_STEP_LOGS = {
    "0.8b-B1-bf16": DecodeConfig(preset("qwen3.5-0.8b"), batch=1),
    "4b-B1-bf16": DecodeConfig(preset("qwen3.5-4b"), batch=1),
    "0.8b-B32-bf16": DecodeConfig(preset("qwen3.5-0.8b"), batch=32),
    "4b-B32-bf16": DecodeConfig(preset("qwen3.5-4b"), batch=32),
}
# Default steps whose every op has a record too, too wide to emulate in CI.
COMMITTED_BF16_WIDE_STEP_LOGS = {
    f"{name.removeprefix('qwen3.5-')}-B256-bf16": DecodeConfig(preset(name), batch=256)
    for name in ("qwen3.5-0.8b", "qwen3.5-4b")
}


def model_only_ops(cfg: DecodeConfig) -> tuple[str, ...]:
    """The ops the whole model launches and its mixer step does not."""
    step = set(step_ops(cfg))
    return tuple(name for name in model_ops(cfg) if name not in step)


# The whole model's ops beyond the mixer step's with H200 records, by default (bf16) config; the model's other ops
# build from their hand schedules (`make build ARGS="--ops model --allow-hand"`).
_MODEL_B1 = {name: DecodeConfig(preset(name), batch=1) for name in ("qwen3.5-0.8b", "qwen3.5-4b")}
COMMITTED_BF16_MODEL_RECORDS = {
    f"{name.removeprefix('qwen3.5-')}-B1-bf16": (cfg, model_only_ops(cfg)) for name, cfg in _MODEL_B1.items()
}


def cuda_source(name: str, cfg: DecodeConfig, **knobs) -> str:
    """The CUDA C++ of `name`'s hand schedule with `knobs` (source only: no GPU here)."""
    source, _ = lower(OPS[name].schedule(cfg, "cuda", **knobs).mod)
    return source


@contextlib.contextmanager
def child_loader(argv: list[str], env: dict | None = None) -> Iterator[Callable[[Path], tuple[str, int]]]:
    """A process started from `argv` that reads a path a line and reports what one forked child did with it, then a
    line `exit <status>`: `run(path)` -> (what the child printed, its exit status; negative: killed by a signal).
    TVM is imported once, and a case that crashes kills only its child."""
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdin is not None and proc.stdout is not None

        def run(path: Path) -> tuple[str, int]:
            proc.stdin.write(f"{path}\n")
            proc.stdin.flush()
            said = []
            while not (line := proc.stdout.readline()).startswith("exit"):
                assert line, "the loader process ended"
                said.append(line.strip())
            return " ".join(said), int(line.split()[1])

        yield run
        proc.stdin.close()
