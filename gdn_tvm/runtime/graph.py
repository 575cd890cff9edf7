"""CUDA-graph capture and replay of a launch plan (cuda-bindings runtime API, no framework needed).

Every TVM launch goes to the stream `tvm_ffi.use_raw_stream` names, so running a plan inside that
context on a capturing stream records it. The plan's kernels read positions and slots from
device buffers, so one captured graph replays at any position.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tvm_ffi


def cuda_check(result):
    """The value of a cuda-bindings runtime call (its error code checked)."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return rest[0] if len(rest) == 1 else rest


def gpu_seconds(stream: Any, run: Callable[[], None]) -> float:
    """Seconds the work `run()` queues on `stream` takes on the GPU (CUDA events recorded around it)."""
    from cuda.bindings import runtime as cudart

    start, end = cuda_check(cudart.cudaEventCreate()), cuda_check(cudart.cudaEventCreate())
    try:
        cuda_check(cudart.cudaEventRecord(start, stream))
        run()
        cuda_check(cudart.cudaEventRecord(end, stream))
        cuda_check(cudart.cudaEventSynchronize(end))
        return cuda_check(cudart.cudaEventElapsedTime(start, end)) / 1e3
    finally:
        cudart.cudaEventDestroy(start)
        cudart.cudaEventDestroy(end)


class CudaGraph:
    """`CudaGraph(run, launches)` captures `run()` once on its own stream (or `stream`, shared with other graphs so
    their replays are ordered), then `then(stream)` where given (e.g. a copy of results to pinned host memory);
    `replay()` launches the graph.

    The stream is a blocking one, ordered with the legacy default stream that host<->device copies use,
    so inputs written with `copyfrom` before `replay()` are seen by the graph and results read after it
    are complete. `run()` makes `launches` kernel calls: a graph holding fewer nodes is an error (a call that
    went to another stream ran once, eagerly, and would be missing from every replay).
    """

    def __init__(
        self,
        run: Callable[[], object],
        launches: int,
        device_id: int = 0,
        then: Callable[[Any], None] | None = None,
        stream: Any = None,
    ):
        from cuda.bindings import runtime as cudart

        self._owns_stream = stream is None
        self._cudart = cudart
        cuda_check(cudart.cudaSetDevice(device_id))
        self.stream = cuda_check(cudart.cudaStreamCreate()) if stream is None else stream
        dev = tvm_ffi.device(f"cuda:{device_id}")
        cuda_check(
            cudart.cudaStreamBeginCapture(self.stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
        )
        try:
            with tvm_ffi.use_raw_stream(dev, int(self.stream)):
                run()
            if then is not None:
                then(self.stream)
        finally:
            graph = cuda_check(cudart.cudaStreamEndCapture(self.stream))
        self.graph = graph
        _, nodes = cuda_check(cudart.cudaGraphGetNodes(graph, 0))
        if nodes < launches:
            raise RuntimeError(
                f"CUDA graph capture recorded {nodes} nodes for {launches} kernel calls: "
                "a call launched outside the capturing stream"
            )
        self.exec = cuda_check(cudart.cudaGraphInstantiate(graph, 0))

    def replay(self) -> None:
        cuda_check(self._cudart.cudaGraphLaunch(self.exec, self.stream))

    def elapsed(self, replays: int) -> float:
        """Seconds that `replays` back-to-back replays take on the GPU (CUDA events around them)."""

        def replays_run() -> None:
            for _ in range(replays):
                self.replay()

        return gpu_seconds(self.stream, replays_run)

    def __del__(self):
        cudart = getattr(self, "_cudart", None)
        if cudart is None:
            return
        if hasattr(self, "exec"):
            cudart.cudaGraphExecDestroy(self.exec)
        if hasattr(self, "graph"):
            cudart.cudaGraphDestroy(self.graph)
        if self._owns_stream:
            cudart.cudaStreamDestroy(self.stream)
