"""HybridStack: the mixer layers of a preset's layer pattern, run as one decode step."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import tvm

from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import WEIGHTS
from gdn_tvm.runtime.graph import CudaGraph
from gdn_tvm.runtime.layers import Kernels, Layer, StepBuffers, bind_layer
from gdn_tvm.runtime.weights import random_weights
from gdn_tvm.signature import HOST, Arg, ArgumentError, check_args, check_device, device_of, is_integer, to_host

_Method = TypeVar("_Method", bound=Callable)


def locked(method: _Method) -> _Method:
    """`method` run holding its object's `_lock` (a stack's or a model's)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)

    return run  # type: ignore[return-value]


def require_cuda(device: tvm.runtime.Device, owner: str) -> None:
    """`RuntimeError` unless `device` is a CUDA GPU: `capture()` makes CUDA graphs (`owner`: whose)."""
    if device.dlpack_device_type() != tvm.cuda().dlpack_device_type():
        raise RuntimeError(f"capture() makes CUDA graphs: this {owner} runs on {device}")


def require_present(device: tvm.runtime.Device, owner: str) -> None:
    """`ArgumentError` naming `device` unless the TVM runtime sees it (`owner`: whose device)."""
    if not device.exist:
        raise ArgumentError(f"device: {device} is not present here (the {owner}'s tensors live on it)")


def _layer_kinds(layer_types) -> tuple[str, ...]:
    """`layer_types` as a tuple of layer kinds (`plan.WEIGHTS`' keys): `ArgumentError` naming it otherwise."""
    kinds = () if isinstance(layer_types, str) else tuple(layer_types)
    if not kinds or not all(isinstance(k, str) and k in WEIGHTS for k in kinds):
        raise ArgumentError(f"layer_types: expected a non-empty sequence of {sorted(WEIGHTS)}, got {layer_types!r}")
    return kinds


class HybridStack:
    """Mixer layers chained (layer i's output is layer i+1's input) over shared step buffers.

    step(x [B, hidden], positions [B], slots [B]) validates everything on the host first (a rejected
    step changes no state), writes the step buffers, then replays every layer's launch plan.
    Slots are handed out by `acquire()` (or named by a step directly, as an engine with its own slot allocator
    does) and returned by `release(slot)`, which zeroes their states.

    Threads: every public method holds the stack's lock, so calls from several threads never interleave their
    input writes, launches and slot changes. A step returns the stack's one output buffer, which the next step
    overwrites: a caller that steps from several threads reads it (or copies it) before another thread steps.
    """

    def __init__(
        self,
        cfg: DecodeConfig,
        kernels: Kernels,
        device: tvm.runtime.Device,
        layer_types: Sequence[str] | None = None,
        weights: Sequence[dict] | None = None,
        seed: int = 0,
    ):
        require_present(device, "stack")
        self.cfg = cfg
        self.device = device
        self.layer_types = cfg.model.layer_types if layer_types is None else _layer_kinds(layer_types)
        if weights is None:
            if not is_integer(seed) or seed < 0:
                raise ArgumentError(f"seed: expected an int >= 0, got {seed!r}")
            rng = np.random.default_rng(seed)
            weights = [random_weights(cfg.model, kind, rng) for kind in self.layer_types]
        if len(weights) != len(self.layer_types):
            raise ValueError(f"weights: {len(weights)} layers given for {len(self.layer_types)} layer types")
        self.io = StepBuffers(cfg, device)
        x = tvm.runtime.empty((cfg.batch, cfg.model.hidden), "float32", device)
        self.layers: list[Layer] = []
        for kind, w in zip(self.layer_types, weights, strict=True):
            self.layers.append(bind_layer(kind, cfg, kernels, w, self.io, x))
            x = self.layers[-1].out
        self._free = list(range(cfg.slots))
        self._lock = threading.RLock()
        self.graph: CudaGraph | None = None
        self._input_devices = tuple(dict.fromkeys((HOST, (device.dlpack_device_type(), device.index))))
        B, L, S = cfg.batch, cfg.max_len, cfg.slots
        self._inputs = [
            Arg("x", (B, cfg.model.hidden)),
            Arg("positions", (B,), "int32", role="index", bound=(0, L)),
            Arg("slots", (B,), "int32", role="index", bound=(-1, S), slot_pool=True),
        ]

    @property
    def x(self) -> tvm.runtime.Tensor:
        return self.layers[0].x

    @property
    def out(self) -> tvm.runtime.Tensor:
        return self.layers[-1].out

    @locked
    def write_inputs(self, x, positions, slots) -> None:
        """Check the step's inputs (raising `ArgumentError` naming the bad one) and write them to the device.

        x: [B, hidden] float32; positions, slots: [B] int32 arrays, or sequences of Python ints. Arrays and tensors
        (numpy, torch, TVM) may live in host memory or on the stack's device. A slot a step names is in use from
        then on: `acquire` does not hand it out until it is released."""
        values = {"x": x, "positions": _int32("positions", positions), "slots": _int32("slots", slots)}
        for name, value in values.items():
            check_device(name, value, self._input_devices)
        check_args(self._inputs, values)
        active = {int(s) for s in to_host(values["slots"]) if s >= 0}
        self._free = [s for s in self._free if s not in active]
        for buffer, value in zip((self.x, self.io.positions, self.io.slots), values.values(), strict=True):
            buffer.copyfrom(_staged(value))

    @locked
    def run(self) -> None:
        """Replay every layer's plan on the inputs already written."""
        for layer in self.layers:
            layer.run()

    @locked
    def step(self, x, positions, slots) -> tvm.runtime.Tensor:
        """One decode step, launched eagerly; returns the last layer's output [B, hidden] (device)."""
        self.write_inputs(x, positions, slots)
        self.run()
        return self.out

    @locked
    def capture(self) -> None:
        """Capture the whole step as one CUDA graph (after one eager warm-up that touches no state)."""
        require_cuda(self.device, "stack")
        skip = np.full(self.cfg.batch, -1, np.int32)
        self.write_inputs(np.zeros((self.cfg.batch, self.cfg.model.hidden), np.float32), np.zeros_like(skip), skip)
        self.run()  # loads every kernel's module before capture; slot -1 everywhere: no state changes
        launches = sum(len(layer.launches) for layer in self.layers)
        self.graph = CudaGraph(self.run, launches, self.device.index)

    @locked
    def step_graph(self, x, positions, slots) -> tvm.runtime.Tensor:
        """One decode step by CUDA-graph replay (call `capture()` once first); same results as `step`."""
        if self.graph is None:
            raise RuntimeError("step_graph before capture(): call capture() once")
        self.write_inputs(x, positions, slots)
        self.graph.replay()
        return self.out

    @locked
    def acquire(self) -> int:
        """A free slot, its states zeroed."""
        if not self._free:
            raise RuntimeError(f"all {self.cfg.slots} slots are in use")
        return self._free.pop(0)

    @locked
    def release(self, slot: int) -> None:
        """Return `slot` (acquired, or named by a step) to the pool and zero its states."""
        self._check_slot(slot)
        if slot in self._free:
            raise ArgumentError(f"slot={slot} is not in use (neither acquired nor named by a step since its release)")
        self.reset(slot)
        self._free.append(slot)

    @locked
    def reset(self, slot: int) -> None:
        """Zero `slot`'s conv/recurrent states and KV rows in every layer."""
        self._check_slot(slot)
        for layer in self.layers:
            layer.reset_slot(slot)

    def _check_slot(self, slot: int) -> None:
        if not is_integer(slot):
            raise ArgumentError(f"slot: expected an int, got {type(slot).__name__}")
        if not 0 <= slot < self.cfg.slots:
            raise ArgumentError(f"slot={slot} is outside [0, {self.cfg.slots})")


def _int32(name: str, value):
    """An index input as `check_args` takes it: arrays and tensors as given (their dtype is checked there), a
    sequence of Python ints as an int32 array; anything else non-integer is an `ArgumentError` naming `name`."""
    if hasattr(value, "__dlpack__"):
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise ArgumentError(f"{name}: expected int32 values, got {array.dtype} ({array.tolist()})")
    if array.size and not (np.iinfo(np.int32).min <= array.min() and array.max() <= np.iinfo(np.int32).max):
        raise ArgumentError(f"{name}: {array.tolist()} do not fit int32")
    return array.astype(np.int32)


def _staged(value):
    """`value` as `Tensor.copyfrom` takes it: a tensor on a device (torch, any DLPack producer) as a TVM tensor."""
    if isinstance(value, np.ndarray | tvm.runtime.Tensor) or device_of(value) == HOST:
        return value
    return tvm.runtime.from_dlpack(value)
