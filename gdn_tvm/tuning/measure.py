"""Functions MetaSchedule's builder and runner workers call (pickled by reference: keep imports light).

`build` compiles a candidate like `make build` does: inside the target's scope, so the CUDA compile uses the
target's arch (sm_90) rather than the local GPU's, and without no-alias for in-place ops. `alloc_arguments`
fills buffers like MetaSchedule's default (random values for measurement) except index buffers, which get
valid slots and positions: random integers would index outside the state pools and KV caches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm

from gdn_tvm.build.compile import compile_mod


def build(mod: tvm.IRModule, target: tvm.target.Target, _params: dict | None) -> tvm.runtime.Module:
    """`f_build` of `LocalBuilder`: compiled as `make build` compiles (target scope, in-place pipeline)."""
    return compile_mod(mod, target).mod


def alloc_arguments(
    index_values: Sequence[np.ndarray | None],
    device: tvm.runtime.Device,
    args_info: Sequence[tuple],
    alloc_repeat: int,
) -> list[list[tvm.runtime.Tensor]]:
    """`f_alloc_argument` of `LocalRunner` (bind `index_values` with `functools.partial`).

    index_values[i]: the values of tensor parameter i when it is an index buffer, else None (random fill).
    args_info: MetaSchedule's `("TENSOR", dtype, shape)` per tensor parameter, in order.
    """
    random_fill = tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")

    def tensor(info: tuple, values: np.ndarray | None) -> tvm.runtime.Tensor:
        _, dtype, shape = info
        if values is not None:
            return tvm.runtime.tensor(values, device)
        out = tvm.runtime.empty(shape, dtype, device)
        random_fill(out)
        return out

    return [
        [tensor(info, values) for info, values in zip(args_info, index_values, strict=True)]
        for _ in range(alloc_repeat)
    ]
