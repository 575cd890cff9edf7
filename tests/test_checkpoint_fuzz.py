"""Fuzzed checkpoints: every damaged shard or config.json ends in a `CheckpointError` that names the file and the
field or tensor, or loads, and then only where the input is in fact valid.

A changed byte inside tensor data leaves a well-formed file (safetensors has no checksum), so the policy there is:
the checkpoint loads when every weight is still finite as float32, and then differs from the undamaged load in at
most the one element that byte belongs to; otherwise the error names that tensor. A changed header byte either
breaks the file (a named error) or is harmless (JSON whitespace): then the load equals the undamaged one.

Hypothesis runs derandomized (the same cases every run). Outcomes are tallied per module and printed at its end:
`pytest -s -p no:xdist tests/test_checkpoint_fuzz.py` shows the counts.
"""

from __future__ import annotations

import functools
import json
import math
import re
import tempfile
from collections import Counter
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save_file
from test_checkpoint import DELETE, HF_CONFIG, split_header, with_field, write_checkpoint

from gdn_tvm.runtime.checkpoint import SIZES, Checkpoint, CheckpointError, load_checkpoint

TALLY: Counter[str] = Counter()
CONFIG = {"text_config": HF_CONFIG}  # Qwen3.5's layout, with its tensor names below
PREFIX = "model.language_model.layers."
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
NEAR_MISSES = [DELETE, None, True, False, 0, -1, 1, 0.0, 1e-6, 0.5, 1.5, 64.0, 4.0, "64", "x", [64], {"v": 64}]
NEAR_MISSES += [math.nan, math.inf, -math.inf, 10**400]


def fuzz(max_examples: int):
    """Deterministic hypothesis settings, no per-case deadline."""
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None)


class Base:
    """The undamaged checkpoint (bf16 with float32 A_log and dt_bias): its shard's bytes and what it loads as. Not a
    dataclass, so that hypothesis prints it in a failing case by its short repr."""

    def __init__(self, path: Path):
        raw = write_checkpoint(path, np.random.default_rng(0), fused=False, prefix=PREFIX, dtype=ml_dtypes.bfloat16)
        f32 = {k: v.astype(np.float32) for k, v in raw.items() if k.endswith(("A_log", "dt_bias"))}
        save_file(raw | f32, str(path / "model.safetensors"))
        self.data = (path / "model.safetensors").read_bytes()
        header, body = split_header(self.data)
        self.header_end = len(self.data) - len(body)  # where the tensor data starts
        self.spans = {name: t["data_offsets"] for name, t in header.items()}  # [start, end) in the data
        # where the dtype names start in the header ("F32" -> "I32" is still a dtype)
        self.dtype_at = [m.start() for m in re.finditer(rb'(?<="dtype":")', self.data[: self.header_end])]
        self.arrays = load_checkpoint(path).arrays()

    def __repr__(self) -> str:
        return f"Base({len(self.data)} bytes)"

    def tensor_at(self, offset: int) -> str:
        """The tensor holding the file's byte `offset` (in the data)."""
        return next(name for name, (lo, hi) in self.spans.items() if lo <= offset - self.header_end < hi)

    def changed_elements(self, loaded: Checkpoint) -> int:
        """Elements of a load that differ from the undamaged one (all its weights must be finite)."""
        arrays = loaded.arrays()
        assert sorted(arrays) == sorted(self.arrays) and all(np.isfinite(w).all() for w in arrays.values())
        return sum(int((w != self.arrays[k]).sum()) for k, w in arrays.items())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Base:
    return Base(tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module", autouse=True)
def tally():
    TALLY.clear()
    yield
    print(f"\n{__name__}: {dict(TALLY)}")


def attempt(shard: bytes, config: bytes):
    """(`load_checkpoint`'s result or the `CheckpointError` it raised, the directory) for a fresh directory holding
    `shard` as model.safetensors and `config` as config.json; any other exception is tallied as a crash."""
    TALLY["cases"] += 1
    with tempfile.TemporaryDirectory(prefix="ckpt") as tmp:
        path = Path(tmp)
        (path / "model.safetensors").write_bytes(shard)
        (path / "config.json").write_bytes(config)
        try:
            return load_checkpoint(path), path
        except CheckpointError as e:
            return e, path
        except BaseException:
            TALLY["crashes"] += 1
            raise


def encode(config: object) -> bytes:
    return json.dumps(config).encode()


def expect_error(got, start: str, *any_of: str) -> None:
    """`got` is a `CheckpointError` whose message starts with `start` (the file) and holds one of `any_of` if given
    (the field or tensor)."""
    if not isinstance(got, CheckpointError):
        TALLY["silent successes"] += 1
        pytest.fail(f"an invalid checkpoint loaded as {got.model}")
    assert str(got).startswith(start) and (not any_of or any(n in str(got) for n in any_of)), f"{got!r}"
    TALLY["named errors"] += 1


def expect_load(got) -> Checkpoint:
    """`got` is a load, not an error."""
    assert not isinstance(got, CheckpointError), f"a valid checkpoint was refused: {got}"
    TALLY["valid loads"] += 1
    return got


@fuzz(200)
@given(st.data())
def test_a_truncated_or_extended_shard_is_named(base, data):
    n = len(base.data)
    cut = data.draw(st.sampled_from([0, 7, 8, base.header_end - 1, base.header_end, n - 1]) | st.integers(0, n - 1))
    tail = data.draw(st.sampled_from([b"", b" ", b"\0"]) | st.binary(max_size=64))
    shard = base.data + tail if data.draw(st.booleans(), label="extend") else base.data[:cut] + tail
    assume(len(shard) != n)  # the data must end at the file's end
    got, path = attempt(shard, encode(CONFIG))
    expect_error(got, f"{path}/model.safetensors: not a valid safetensors file")


@fuzz(500)
@given(st.data())
def test_a_changed_header_byte_is_named_or_harmless(base, data):
    at = data.draw(st.integers(0, base.header_end - 1) | st.sampled_from(base.dtype_at))
    byte = data.draw(st.integers(0, 255) | st.sampled_from(b"IUFB0123456789 "))
    assume(byte != base.data[at])
    got, path = attempt(base.data[:at] + bytes([byte]) + base.data[at + 1 :], encode(CONFIG))
    if isinstance(got, CheckpointError):
        expect_error(got, f"{path}/", *(("not a valid", "has dtype") if at in base.dtype_at else (".safetensors",)))
    elif base.changed_elements(expect_load(got)):
        TALLY["silent successes"] += 1
        pytest.fail(f"byte {at} -> {byte}: loaded with other values")


@fuzz(300)
@given(st.data())
def test_a_changed_data_byte_names_its_tensor_or_changes_one_element(base, data):
    at = data.draw(st.integers(base.header_end, len(base.data) - 1))
    byte = data.draw(st.sampled_from([0x7F, 0xFF, 0x43, 0xC3]) | st.integers(0, 255))  # NaN/inf, 128..256 (exp)
    assume(byte != base.data[at])
    got, path = attempt(base.data[:at] + bytes([byte]) + base.data[at + 1 :], encode(CONFIG))
    if isinstance(got, CheckpointError):
        expect_error(got, f"{path}/model.safetensors: tensor {base.tensor_at(at)} holds NaN or inf")
    else:
        assert base.changed_elements(expect_load(got)) <= 1


FLOAT32_NORMAL = (2.0**-126, float(np.finfo(np.float32).max))  # the kernels' float32 literals: no overflow, no flush


def rotates_pairs(x: float) -> bool:
    """A rotary fraction of HF_CONFIG's head_dim that rotates a whole number (>= 1) of pairs of dims."""
    dims = int(HF_CONFIG["head_dim"] * x)
    return 0 < x <= 1 and dims >= 2 and dims % 2 == 0


NUMBERS = {  # config.json float field: ModelConfig field, valid range
    "rms_norm_eps": ("rms_norm_eps", lambda x: FLOAT32_NORMAL[0] <= x <= FLOAT32_NORMAL[1]),
    "rope_parameters.rope_theta": ("rope_theta", lambda x: FLOAT32_NORMAL[0] <= x <= FLOAT32_NORMAL[1]),
    "rope_parameters.partial_rotary_factor": ("partial_rotary_factor", rotates_pairs),
}
SIZE_FIELDS = [*SIZES.values(), "vocab_size", "intermediate_size"]  # integers >= 1 that tensor shapes follow
FIELDS = [*SIZE_FIELDS, "full_attention_interval", *NUMBERS, "layer_types", "rope_parameters", ""]  # "": all


def twins(value: object) -> list:
    """`value` and look-alikes of other JSON types: 64 -> 64.0, "64", [64]; 1 -> true."""
    alike = [value, str(value), [value]]
    return alike + ([float(value)] + [True] * (value == 1) if type(value) is int else [])


def must_load(field: str, value: object, original: object) -> bool:
    """Whether HF_CONFIG with `field` (dotted, under text_config; "" for text_config itself) set to `value` instead of
    `original` describes the test checkpoint: written independently of the loader, from the rules in its docstrings."""
    if field in NUMBERS:
        if value is DELETE:
            return field == "rms_norm_eps"  # the one float field with a default
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        try:
            return NUMBERS[field][1](float(value))
        except OverflowError:  # an int beyond float64: out of every range
            return False
    if field == "full_attention_interval" and value is DELETE:  # the default, 4, is HF_CONFIG's
        return True
    if field == "layer_types" and value in (DELETE, None):
        return True
    return type(value) is type(original) and value == original  # sizes, and objects: only as they were


@fuzz(600)
@given(st.sampled_from(FIELDS), st.data())
def test_a_config_field_of_any_json_value_is_named_or_valid(base, field, data):
    path = "text_config" + (f".{field}" if field else "")
    original = functools.reduce(lambda section, key: section[key], path.split("."), CONFIG)
    values = st.sampled_from(twins(original)) | st.sampled_from(NEAR_MISSES) | st.integers(-2, 300) | JSON
    value = data.draw(values, label=path)
    got, directory = attempt(base.data, encode(with_field(CONFIG, path, value)))
    leaf = path.split(".")[-1]
    if must_load(field, value, original):
        loaded = expect_load(got)
        m = loaded.model
        if field in NUMBERS:
            attr = NUMBERS[field][0]
            assert getattr(m, attr) == (1e-6 if value is DELETE else float(value)), attr
        assert base.changed_elements(loaded) == 0
    elif isinstance(got, CheckpointError) and leaf in SIZE_FIELDS and "has shape" in str(got):
        expect_error(got, f"{directory}/model.safetensors: tensor")  # a valid size, not the checkpoint's
    else:
        expect_error(got, f"{directory}/config.json: ", *(("text_config", "hidden_size") if field == "" else (leaf,)))


@fuzz(200)
@given(st.binary(max_size=64) | JSON.map(encode))
def test_a_config_json_of_random_bytes_or_values_is_named(base, content):
    got, path = attempt(base.data, content)
    expect_error(got, f"{path}/config.json: ")
