"""How candidates are built and measured: a builder whose worker processes live through a tuning session, and
the functions its workers and MetaSchedule's runner worker call (pickled by reference: keep imports light).

`build_and_export` compiles a candidate like `make build` does: inside the target's scope, so the CUDA compile
uses the target's arch (sm_90) rather than the local GPU's, and without no-alias for in-place ops.
`alloc_arguments` fills buffers like MetaSchedule's default (random values for measurement) except index buffers,
which get valid slots and positions: random integers would index outside the state pools and KV caches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import default_export
from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

from gdn_tvm.codegen.compile import compile_mod
from gdn_tvm.traffic import LAUNCHES


@derived_object
class PoolBuilder(PyBuilder):
    """MetaSchedule's `LocalBuilder` starts a fresh process pool for every batch, and each worker then spends
    seconds importing TVM: on the H200 that was most of a workload's tuning time. This one keeps its `workers`
    processes and starts them again only every `recycle` batches (the workers leak a little memory)."""

    def __init__(self, workers: int, timeout_sec: float = 60.0, recycle: int = 64):
        super().__init__()
        self.workers, self.timeout_sec, self.recycle = workers, timeout_sec, recycle
        self.batches = 0
        self.pool: PopenPoolExecutor | None = None

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        if self.pool is None or self.batches % self.recycle == 0:
            if self.pool is not None:
                self.pool.shutdown()
            self.pool = PopenPoolExecutor(max_workers=self.workers, timeout=self.timeout_sec)
        self.batches += 1
        results = []
        jobs = [(i.mod, i.target) for i in build_inputs]
        for r in self.pool.map_with_error_catching(lambda job: build_and_export(*job), jobs):
            if r.status == StatusKind.COMPLETE:
                results.append(BuilderResult(r.value, None))
            elif r.status == StatusKind.TIMEOUT:
                results.append(BuilderResult(None, f"PoolBuilder: timeout, killed after {self.timeout_sec} s"))
            else:
                results.append(BuilderResult(None, f"PoolBuilder: an exception occurred\n{r.value}"))
        return results


def build_and_export(mod: tvm.IRModule, target: tvm.target.Target) -> str:
    """A builder worker's job: the candidate compiled as `make build` compiles (target scope, in-place pipeline),
    then exported for the runner; returns the artifact's path."""
    return default_export(compile_mod(mod, target).mod)


def graph_run_evaluator(
    rt_mod: tvm.runtime.Module,
    device: tvm.runtime.Device,
    evaluator_config,
    repeated_args: list[list[tvm.runtime.Tensor]],
    make_graph: Callable | None = None,
) -> list[float]:
    """`f_run_evaluator` of the CUDA runner: seconds per launch as a captured decode step sees them.

    MetaSchedule's default times eager calls, and an eager call of a microsecond kernel is bound by the host's
    launch rate: on the H200 the tuner measured 3.5-5 us for kernels the benchmark times at 1.3-1.8 us, so small
    ops' candidates came out equal, in noise order. Here `LAUNCHES` launches, rotating over the argument
    sets (`alloc_repeat` of them, so big working sets leave L2), are captured in one CUDA graph; each of the
    `repeat` samples replays it for at least `min_repeat_ms`. `make_graph(run, device_id)` defaults to
    `gdn_tvm.runtime.graph.CudaGraph`.
    """
    if make_graph is None:
        from gdn_tvm.runtime.graph import CudaGraph

        make_graph = CudaGraph
    func = rt_mod[rt_mod.entry_name]

    def run() -> None:
        for i in range(LAUNCHES):
            func(*repeated_args[i % len(repeated_args)])

    run()  # eager first: the module's kernels load at their first call, which must not happen during capture
    device.sync()
    graph = make_graph(run, device.index)
    graph.replay()
    once = graph.elapsed(1)
    replays = max(1, math.ceil(evaluator_config.min_repeat_ms / 1e3 / max(once, 1e-9)))
    return [graph.elapsed(replays) / (replays * LAUNCHES) for _ in range(evaluator_config.repeat)]


_SETS: dict[tuple, list[list[tvm.runtime.Tensor]]] = {}  # the runner worker's sets for the workload in hand


def alloc_arguments(
    index_values: Sequence[np.ndarray | None],
    device: tvm.runtime.Device,
    args_info: Sequence[tuple],
    alloc_repeat: int,
) -> list[list[tvm.runtime.Tensor]]:
    """`f_alloc_argument` of `LocalRunner` (bind `index_values` with `functools.partial`).

    index_values[i]: the values of tensor parameter i when it is an index buffer or a counter, else None (random
    fill).
    args_info: MetaSchedule's `("TENSOR", dtype, shape)` per tensor parameter, in order.
    The runner's worker process lives through the session and calls this once per candidate: the sets (one
    random fill, copied on the device into the others, each in its own memory) are made once per workload and
    kept until the next one (the fill runs on the host; four sets of the B=32 KV caches took over a minute per
    candidate batch on the H200 machine). Candidates update state buffers in place, so later candidates see
    other values: the timing does not depend on them.
    """
    key = (
        device.dlpack_device_type(),
        device.index,
        repr(list(args_info)),
        alloc_repeat,
        tuple(None if v is None else (v.dtype.str, v.shape, v.tobytes()) for v in index_values),
    )
    if key not in _SETS:
        _SETS.clear()  # one workload's sets at a time: a set of 4b B=32 KV caches is 1 GiB
        first = [_tensor(info, values, device) for info, values in zip(args_info, index_values, strict=True)]
        _SETS[key] = [first] + [[_copy(t, device) for t in first] for _ in range(alloc_repeat - 1)]
    return _SETS[key]


def _tensor(info: tuple, values: np.ndarray | None, device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    """`values` on `device`, or (None) a buffer of `info`'s shape and dtype, randomly filled."""
    _, dtype, shape = info
    if values is not None:
        return tvm.runtime.tensor(values, device)
    out = tvm.runtime.empty(shape, dtype, device)
    tvm.get_global_func("tvm.contrib.random.random_fill_for_measure")(out)
    return out


def _copy(t: tvm.runtime.Tensor, device: tvm.runtime.Device) -> tvm.runtime.Tensor:
    out = tvm.runtime.empty(t.shape, t.dtype, device)
    out.copyfrom(t)
    return out
