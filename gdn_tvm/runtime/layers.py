"""A plan (`gdn_tvm.plan`: a mixer layer's, or the whole model's) bound to compiled kernels and device memory.

Binding allocates the plan's activations and states once, uploads its weights, makes its views, and checks every
launch's buffers against its kernel's signature; each step replays the bound launches: no shape logic and no
allocation in the step loop. State pools (conv and recurrent states, KV caches) are `[slots, ...]` device tensors
indexed by the step's slot ids. The per-step inputs (slots, positions) live in a shared `StepBuffers`, written
before the plan runs, so the same launches (or a CUDA graph captured from them) serve every position.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import tvm
from tvm.runtime import Tensor

from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import PLANS, Buffer, Plan
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.runtime.views import row_view
from gdn_tvm.runtime.weights import check_weights, upload
from gdn_tvm.signature import ArgumentError, bind, check_args

Kernels = Mapping[str, Kernel]
FILL_CHUNK = 1 << 26  # bytes of the host buffer `fill` writes a device tensor from


class StepBuffers:
    """Device inputs of one step: `slots` [B] (initially all -1: no lane active) and `positions` [B] int32."""

    def __init__(self, cfg: DecodeConfig, device: tvm.runtime.Device):
        self.slots = tvm.runtime.tensor(np.full(cfg.batch, -1, np.int32), device)
        self.positions = tvm.runtime.tensor(np.zeros(cfg.batch, np.int32), device)


class Layer:
    """`plan` bound: its inputs are the caller's tensors (`inputs`, by plan name), `out` its output.

    `launched` names the bound launches' ops and `launches` holds their (function, arguments), in order; `states`
    are the plan's state pools, `tensors` every bound buffer by plan name, `weights` the uploaded weights."""

    def __init__(self, plan: Plan, cfg: DecodeConfig, kernels: Kernels, weights: Mapping, inputs: Mapping[str, Tensor]):
        check_weights(plan.weights, weights, plan.kind)
        self.kind, self.cfg = plan.kind, cfg
        self.device = next(iter(inputs.values())).device
        self.weights = upload(weights, plan.weights, self.device, plan.stacks)
        self.tensors: dict[str, tvm.runtime.Tensor] = {}
        self.states: list[tvm.runtime.Tensor] = []
        for name, buffer in plan.buffers.items():
            self.tensors[name] = self._tensor(name, buffer, inputs)
        self.x, self.out = self.tensors.get("x"), self.tensors[plan.out]
        self.launches: list[tuple[Callable, list]] = []
        self.launched: list[str] = []
        for launch in plan.launches:
            self._bind(launch.op, {arg: self.tensors[buffer] for arg, buffer in launch.args.items()}, kernels)

    def _tensor(self, name: str, buffer: Buffer, inputs: Mapping[str, Tensor]) -> tvm.runtime.Tensor:
        if buffer.role == "input":
            return inputs[name]
        if buffer.role == "weight":
            return self.weights[name]
        if buffer.role == "view":
            base = self.tensors[buffer.base]
            if buffer.start:
                return row_view(base, buffer.start, buffer.shape)
            return base._create_view(buffer.shape)
        tensor = tvm.runtime.empty(buffer.shape, buffer.dtype, self.device)
        if buffer.role == "state":
            self.states.append(tensor)
        if buffer.role == "state" or np.dtype(buffer.dtype).kind in "iu":  # ids and the like: valid (0) from the start
            fill(tensor, 0)
        return tensor

    def _bind(self, name: str, values: dict, kernels: Kernels) -> None:
        """Append a launch; its buffers are checked against the kernel's signature once, here."""
        if name not in kernels:
            raise ArgumentError(f"kernels: no kernel {name!r} (build it for this preset and batch)")
        kernel = kernels[name]
        try:
            check_args(kernel.signature, values, kernel.device, check_weights=False)
        except ArgumentError as err:
            raise ArgumentError(f"{name}: {err} (kernels built for another configuration?)") from None
        self.launches.append((kernel.func, bind(kernel.signature, values)))
        self.launched.append(name)

    def run(self) -> None:
        """Launch the plan once (inputs already in `x` and the step buffers)."""
        for func, args in self.launches:
            func(*args)

    def reset_slot(self, slot: int) -> None:
        """Zero every state row of `slot`."""
        for t in self.states:
            write_row(t, slot, 0)


def write_row(tensor: tvm.runtime.Tensor, index: int, value) -> None:
    """`tensor[index] = value` on its device (row `index` of a `[N, ...]` tensor, `value` broadcast over it)."""
    row = math.prod(tensor.shape[1:])
    fill(tensor, value, index * row, row)


def fill(tensor: tvm.runtime.Tensor, value, start: int = 0, count: int | None = None) -> None:
    """Elements `[start, start + count)` of `tensor`, flat (default: all from `start`), set to `value` on its
    device, from a host buffer of at most `FILL_CHUNK` bytes: a host copy of a whole KV cache or state pool would
    double what it takes of the host's memory."""
    dtype = str(tensor.dtype)
    size = np.dtype(dtype).itemsize
    count = math.prod(tensor.shape) - start if count is None else count
    step = max(1, FILL_CHUNK // size)
    chunk = np.full(min(step, count), value, dtype)
    for first in range(start, start + count, step):
        n = min(step, start + count - first)
        tensor._create_view((n,), relative_byte_offset=first * size).copyfrom(chunk[:n])


def bind_layer(
    kind: str, cfg: DecodeConfig, kernels: Kernels, weights: dict, io: StepBuffers, x: tvm.runtime.Tensor
) -> Layer:
    """The `kind` mixer's plan for `cfg`, bound to input `x` and the step buffers `io`."""
    return Layer(PLANS[kind](cfg), cfg, kernels, weights, {"x": x, "slots": io.slots, "positions": io.positions})
