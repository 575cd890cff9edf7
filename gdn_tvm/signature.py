"""Kernel signatures: what each PrimFunc parameter is, and the checks every entry point runs.

A signature is the ordered list of a PrimFunc's parameters as `Arg`s. Roles:
  in       activation input                      weight   model weight (checked for NaN/inf)
  out      output, fully written by the kernel   state    pool updated in place (conv, recurrent, KV)
  index    int32 slots or positions, checked against `bound` (slot -1 means "skip this lane")
  scratch  workspace the kernel writes before it reads (a chain of launches' partial results): no result
  counter  int32 arrival counters (`ops.common.arrive`), one parameter read and written in place: zero before a
           launch (checked) and after it
An `Arg` with `alias` is the write side of an in-place state: the caller passes the state once and
the launcher binds it to both parameters.

Only numpy is needed here, so the runtime can import it without the TVM compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

ROLES = ("in", "weight", "out", "state", "index", "scratch", "counter")
DEVICE_NAMES = {1: "cpu", 2: "cuda"}

Sampler = Callable[[np.random.Generator, tuple[int, ...]], np.ndarray]


class ArgumentError(ValueError):
    """A kernel or layer argument failed a check; the message names the argument."""


@dataclass(frozen=True)
class Arg:
    """One PrimFunc parameter. `bound = (lo, hi)` admits `lo <= v < hi` (index roles)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    role: str = "in"
    bound: tuple[int, int] | None = None
    sample: Sampler | None = None
    alias: str | None = None
    slot_pool: bool = False  # index arg holding slots: active entries must be distinct

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.name}: role must be one of {ROLES}, got {self.role!r}")
        if self.role == "index" and self.bound is None:
            raise ValueError(f"{self.name}: index args need a bound")

    @property
    def limits(self) -> tuple[int, int]:
        """`bound` of an index arg (the index role always has one)."""
        if self.bound is None:
            raise ValueError(f"{self.name}: not an index argument")
        return self.bound

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


def visible(signature: Sequence[Arg]) -> list[Arg]:
    """The caller-facing args: every parameter except alias write sides."""
    return [a for a in signature if a.alias is None]


def bind(signature: Sequence[Arg], values: Mapping[str, object]) -> list[object]:
    """PrimFunc parameter values in order, alias parameters bound to their state."""
    return [values[a.alias or a.name] for a in signature]


def _dtype_name(value: object) -> str:
    return str(getattr(value, "dtype", type(value).__name__)).removeprefix("torch.")


HOST = (1, 0)  # DLPack (device type, index) of host memory


def device_of(value: object) -> tuple[int, int]:
    """DLPack (device type, index) of an array or tensor; host memory for anything without one."""
    if hasattr(value, "__dlpack_device__"):
        kind, index = value.__dlpack_device__()
        return int(kind), int(index)
    return HOST


def _device_name(device: tuple[int, int]) -> str:
    return f"{DEVICE_NAMES.get(device[0], device[0])}:{device[1]}"


def check_device(name: str, value: object, allowed: Sequence[tuple[int, int]]) -> None:
    """Raise `ArgumentError` naming `name` unless `value` is on one of the `allowed` DLPack (type, index) devices."""
    dev = device_of(value)
    if dev not in allowed:
        want = " or ".join(_device_name(d) for d in allowed)
        raise ArgumentError(f"{name}: expected an array on {want}, got one on {_device_name(dev)}")


ALIGNMENT = 16  # bytes: float4 loads on the GPU, aligned vector loads on the CPU


def is_contiguous(value: Any) -> bool:
    """C-contiguous (numpy, torch or TVM tensor)."""
    if isinstance(value, np.ndarray):
        return value.flags.c_contiguous
    return bool(value.is_contiguous())


def address(value: Any) -> int:
    """Address of the first element (numpy, torch or TVM tensor)."""
    return value.ctypes.data if isinstance(value, np.ndarray) else int(value.data_ptr())


def to_host(value: Any) -> np.ndarray:
    """A host numpy array of a numpy array, TVM tensor (copied from its device) or torch tensor."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch
        return value.detach().cpu().numpy()
    return value.numpy()


def check_args(
    signature: Sequence[Arg],
    values: Mapping[str, object],
    device: tuple[int, int] | None = None,
    *,
    check_weights: bool = True,
) -> None:
    """Raise `ArgumentError` naming the first bad argument; touches no buffer.

    Checks presence, shape, dtype, contiguity, 16-byte alignment, device, index bounds (slots in [-1, S),
    positions < max_len, distinct active slots), zero arrival counters and, when `check_weights`, that weights hold
    no NaN or inf.
    """
    args = visible(signature)
    names = {a.name for a in args}
    missing = [n for n in names if n not in values]
    extra = [n for n in values if n not in names]
    if missing or extra:
        raise ArgumentError(f"arguments: missing {sorted(missing)}, unexpected {sorted(extra)}")
    for a in args:
        v = values[a.name]
        shape = tuple(int(s) for s in getattr(v, "shape", ()))
        if not hasattr(v, "shape"):
            raise ArgumentError(f"{a.name}: expected an array of shape {a.shape}, got {type(v).__name__}")
        if shape != a.shape:
            raise ArgumentError(f"{a.name}: expected shape {a.shape}, got {shape}")
        dt = _dtype_name(v)
        if dt != a.dtype:
            raise ArgumentError(f"{a.name}: expected dtype {a.dtype}, got {dt}")
        if not is_contiguous(v):
            raise ArgumentError(f"{a.name}: expected a contiguous array (pass a copy of the view)")
        if address(v) % ALIGNMENT:
            raise ArgumentError(f"{a.name}: data is not {ALIGNMENT}-byte aligned (a sliced view?); pass a copy")
        if device is not None:
            check_device(a.name, v, (device,))
        if a.role == "index":
            _check_index(a, to_host(v))
        elif a.role == "counter" and to_host(v).any():
            raise ArgumentError(f"{a.name}: arrival counters must be zero between launches, got {to_host(v).tolist()}")
        elif a.role == "weight" and check_weights:
            if not np.isfinite(to_host(v)).all():
                raise ArgumentError(f"{a.name}: weight holds NaN or inf")


def _check_index(a: Arg, host: np.ndarray) -> None:
    lo, hi = a.limits
    bad = (host < lo) | (host >= hi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ArgumentError(f"{a.name}[{i}]={int(host.flat[i])} is outside [{lo}, {hi})")
    if a.slot_pool:
        active = host[host >= 0]
        if len(np.unique(active)) != len(active):
            raise ArgumentError(f"{a.name}: active slots must be distinct, got {host.tolist()}")


def is_integer(value: object) -> bool:
    """A Python or numpy integer, not a bool (which Python counts as one)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_float(dtype: object) -> bool:
    """A floating dtype, bfloat16 (ml_dtypes: not numpy's kind "f") included."""
    dt = np.dtype(dtype)  # type: ignore[call-overload]
    return dt.kind == "f" or dt == ml_dtypes.bfloat16


def peaked_logits(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Logits spread like a trained model's (a few tokens carry most of the probability)."""
    return (4.0 * rng.standard_normal(shape)).astype(np.float32)


def poisoned(arg: Arg) -> np.ndarray:
    """A host array for an output that no kernel writes (so an unwritten element fails a comparison): NaN, or an
    integer output's most negative value."""
    dtype = np.dtype(arg.dtype)
    return np.full(arg.shape, np.nan if is_float(dtype) else np.iinfo(dtype).min, dtype=dtype)


def sample(arg: Arg, rng: np.random.Generator) -> np.ndarray:
    """A fresh random value for an input, weight, state or index argument."""
    if arg.sample is not None:
        return arg.sample(rng, arg.shape)
    if arg.role in ("out", "scratch"):
        return poisoned(arg)
    if arg.role == "counter":
        return np.zeros(arg.shape, arg.dtype)
    if arg.role == "index":
        lo, hi = arg.limits
        if arg.slot_pool:
            return _sample_slots(rng, arg.shape[0], hi)
        return rng.integers(max(lo, 0), hi, size=arg.shape, dtype=np.int32)
    # drawn in float32 (a bfloat16 one rounded from it, so references see the stored values): a 635M-element LM head
    # or embedding table takes under half the float64 draw's time
    return rng.standard_normal(arg.shape, dtype=np.float32).astype(arg.dtype, copy=False)


def _sample_slots(rng: np.random.Generator, batch: int, n_slots: int) -> np.ndarray:
    """Distinct slots in random order; with batch >= 3 one lane is skipped (-1)."""
    slots = rng.permutation(n_slots)[:batch].astype(np.int32)
    if batch >= 3:
        slots[rng.integers(batch)] = -1
    return slots
