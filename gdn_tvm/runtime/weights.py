"""Mixer weights (names and shapes: `plan.WEIGHTS`, dtypes: `plan.stored_dtype`): random defaults for demos and tests,
checks, upload to a device.

A weight is given in its stored dtype, or in float32 where that is bf16: `upload` then rounds it to the nearest even
bf16, once, where it lives (numpy on the host, a torch tensor on its device)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

import numpy as np
import tvm

from gdn_tvm.config import STACKED, ModelConfig
from gdn_tvm.plan import VIEW_ALIGN, WEIGHTS, Buffer, block_weights, model_weights
from gdn_tvm.runtime.views import row_view
from gdn_tvm.signature import ArgumentError, address, device_of, is_contiguous, to_host


def random_weights(m: ModelConfig, kind: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 weights of a `kind` ("gdn" | "attention") mixer, scaled like a trained model's."""
    out = {}
    for name, shape in WEIGHTS[kind](m).items():
        if name == "A":
            w = -np.exp(rng.uniform(0.0, np.log(16.0), shape))  # A = -exp(A_log), A_log ~ U(0, log 16)
        elif name == "dt_bias":
            dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), shape))
            w = dt + np.log(-np.expm1(-dt))  # inverse softplus of dt
        elif name == "norm":  # the gated RMSNorm's weight, used as stored
            w = 1.0 + 0.1 * rng.standard_normal(shape)
        else:  # q_norm and k_norm (zero-centred), the projections and the conv weight
            w = _random(rng, name, shape)
        out[name] = w.astype(np.float32, copy=False)
    return out


def random_model_weights(m: ModelConfig, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 weights of the whole model by `plan.model` name (`layers.<i>.<name>`, `embed_tokens`, `norm`,
    `lm_head` where untied), scaled like a trained model's."""
    out: dict[str, np.ndarray] = {}
    for i, kind in enumerate(m.layer_types):
        out |= {f"layers.{i}.{k}": v for k, v in random_weights(m, kind, rng).items()}
        for name, shape in block_weights(m).items():
            out[f"layers.{i}.{name}"] = _random(rng, name, shape)
    for name, shape in model_weights(m).items():
        if not (name == "lm_head" and m.tie_word_embeddings):
            out[name] = _random(rng, name, shape)
    return out


def _random(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A zero-centred norm weight near 0 (the kernels scale by 1 + w), or a matrix with rows of about unit norm (the
    embedding: unit entries; float32 draws in place: a 27b stack is 12 GiB of them)."""
    if len(shape) == 1:
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    w = rng.standard_normal(shape, dtype=np.float32)
    if name != "embed_tokens":
        w *= np.float32(1 / np.sqrt(shape[-1]))
    return w


# The float32 magnitude from which rounding to bfloat16 (to nearest even) gives inf: 0x7F7F8000, halfway past the
# largest finite bfloat16.
BF16_OVERFLOW = np.uint32(0x7F7F8000).view(np.float32)


def check_weights(expected: Mapping[str, Buffer], weights: Mapping, what: str) -> None:
    """Every weight of `expected` (a plan's `weights`: name -> shape and stored dtype) present, of its shape, in its
    stored dtype (or float32), finite in its stored dtype; the error names the weight (`what`: whose weights, for a
    missing one)."""
    if not isinstance(weights, Mapping):
        raise ArgumentError(f"{what} weights: expected a mapping of names to arrays, got {type(weights).__name__}")
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise ArgumentError(f"{what} weights: missing {missing}")
    unread = sorted(set(weights) - set(expected))
    if unread:  # a misspelt name, or another model's layers: nothing would read them
        raise ArgumentError(f"{what} weights: {len(unread)} not of this model, e.g. {unread[:3]}")
    for name, want in expected.items():
        w = weights[name]
        if not hasattr(w, "shape") or not hasattr(w, "dtype"):
            raise ArgumentError(f"weight {name}: expected an array, got {type(w).__name__}")
        if tuple(w.shape) != want.shape:
            raise ArgumentError(f"weight {name}: expected shape {want.shape}, got {tuple(w.shape)}")
        accepted = dict.fromkeys((want.dtype, "float32"))
        if _dtype(w) not in accepted:
            raise ArgumentError(f"weight {name}: expected {' or '.join(accepted)}, got {_dtype(w)}")
        rounded = _dtype(w) != want.dtype  # float32 given, bf16 stored: finite only below where bf16 overflows
        if hasattr(w, "isfinite"):  # torch: checked where it lives
            if getattr(w, "is_meta", False) or str(getattr(w, "layout", "torch.strided")) != "torch.strided":
                raise ArgumentError(f"weight {name}: expected a dense tensor with data, got {w.layout} on {w.device}")
            finite = bool((w.abs() < float(BF16_OVERFLOW)).all() if rounded else w.isfinite().all())
        else:
            host = to_host(w)
            finite = bool((np.abs(host) < BF16_OVERFLOW).all() if rounded else np.isfinite(host).all())  # NaN: false
        if not finite:
            raise ArgumentError(f"weight {name}: holds NaN or inf" + (f" (as {want.dtype})" if rounded else ""))


def unstack(m: ModelConfig, weights: dict) -> dict:
    """The inverse of `upload(stacked=...)`: each stacked projection split back into its parts (row slices of numpy
    or torch arrays, no copy), so a layer's `weights` read by checkpoint names."""
    out = dict(weights)
    for name, parts in STACKED.items():
        if name in out:
            w, start = out.pop(name), 0
            for part in parts:
                rows = m.projections[part][0]
                out[part], start = w[start : start + rows], start + rows
    return out


def upload(
    weights: Mapping, expected: Mapping[str, Buffer], device: tvm.runtime.Device, stacks: Mapping[str, tuple] = {}
) -> dict[str, tvm.runtime.Tensor]:
    """Weights (checked by `check_weights` against `expected`) as tensors on `device`, in their stored dtypes: arrays
    already there in that dtype (numpy on the CPU, torch on the GPU, TVM tensors) are shared through DLPack without
    a copy when contiguous and 64-byte aligned; the rest are copied, float32 ones rounded first where they live. Each
    of `stacks` (name -> parts) becomes one tensor of that name, each part's rows copied once into it from wherever
    the part lives (device to device for a GPU tensor), or the parts joined on the host where one would start off the
    `VIEW_ALIGN` bytes a view needs (odd sizes of small checkpoints)."""
    stacked = {part for parts in stacks.values() for part in parts}
    weights = {name: _stored(weights[name], w.dtype) for name, w in expected.items()}
    out = {name: _on_device(w, device) for name, w in weights.items() if name not in stacked}
    for name, parts in stacks.items():
        shapes = [tuple(weights[p].shape) for p in parts]
        dtype = expected[parts[0]].dtype
        starts = list(itertools.accumulate((math.prod(shape) for shape in shapes[:-1]), initial=0))
        if any(start * np.dtype(dtype).itemsize % VIEW_ALIGN for start in starts):  # a part no view can start at
            out[name] = tvm.runtime.tensor(np.concatenate([to_host(weights[p]) for p in parts]), device)
            continue
        whole = tvm.runtime.empty((sum(rows for rows, _ in shapes), shapes[0][1]), dtype, device)
        for part, shape, start in zip(parts, shapes, starts, strict=True):
            w = weights[part]
            source = _on_device(w, device) if _lives_on(w, device) else np.ascontiguousarray(to_host(w))
            row_view(whole, start, shape).copyfrom(source)
        out[name] = whole
    return out


def _dtype(w) -> str:
    return str(w.dtype).removeprefix("torch.")


def _stored(w, dtype: str):
    """`w` in `dtype`: itself, or (a float32 weight of a bf16 one) rounded to the nearest even where it lives: a
    torch tensor on its device, anything else on the host."""
    if _dtype(w) == dtype:
        return w
    if hasattr(w, "detach"):  # torch
        import torch

        return w.detach().to(getattr(torch, dtype))
    return to_host(w).astype(dtype)


def _lives_on(w, device: tvm.runtime.Device) -> bool:
    if isinstance(w, tvm.runtime.Tensor):
        return w.device == device
    return hasattr(w, "__dlpack_device__") and device_of(w) == (device.dlpack_device_type(), device.index)


def _on_device(w, device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    if isinstance(w, tvm.runtime.Tensor) and w.device == device:
        return w
    numpy_bf16 = isinstance(w, np.ndarray) and w.dtype.kind == "V"  # numpy exports no bfloat16 through DLPack
    if _lives_on(w, device) and is_contiguous(w) and address(w) % 64 == 0 and not numpy_bf16:
        return tvm.runtime.from_dlpack(w)
    return tvm.runtime.tensor(np.ascontiguousarray(to_host(w)), device)
