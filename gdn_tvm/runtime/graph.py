"""CUDA-graph capture and replay of a launch plan (cuda-bindings runtime API, no framework needed).

Every TVM launch goes to the stream `tvm_ffi.use_raw_stream` names, so running a plan inside that
context on a capturing stream records it. The plan's kernels read positions and slots from
device buffers, so one captured graph replays at any position.
"""

from __future__ import annotations

from collections.abc import Callable

import tvm_ffi


def _check(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA runtime error {err}")
    return rest[0] if len(rest) == 1 else rest


class CudaGraph:
    """`CudaGraph(run, launches)` captures `run()` once on its own stream; `replay()` launches the graph.

    The stream is a blocking one, ordered with the legacy default stream that host<->device copies use,
    so inputs written with `copyfrom` before `replay()` are seen by the graph and results read after it
    are complete. `run()` makes `launches` kernel calls: a graph holding fewer nodes is an error (a call that
    went to another stream ran once, eagerly, and would be missing from every replay).
    """

    def __init__(self, run: Callable[[], object], launches: int, device_id: int = 0):
        from cuda.bindings import runtime as cudart

        self._cudart = cudart
        _check(cudart.cudaSetDevice(device_id))
        self.stream = _check(cudart.cudaStreamCreate())
        dev = tvm_ffi.device(f"cuda:{device_id}")
        _check(
            cudart.cudaStreamBeginCapture(self.stream, cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal)
        )
        try:
            with tvm_ffi.use_raw_stream(dev, int(self.stream)):
                run()
        finally:
            graph = _check(cudart.cudaStreamEndCapture(self.stream))
        self.graph = graph
        _, nodes = _check(cudart.cudaGraphGetNodes(graph, 0))
        if nodes < launches:
            raise RuntimeError(
                f"CUDA graph capture recorded {nodes} nodes for {launches} kernel calls: "
                "a call launched outside the capturing stream"
            )
        self.exec = _check(cudart.cudaGraphInstantiate(graph, 0))

    def replay(self) -> None:
        _check(self._cudart.cudaGraphLaunch(self.exec, self.stream))

    def elapsed(self, replays: int) -> float:
        """Seconds that `replays` back-to-back replays take on the GPU (CUDA events around them)."""
        cudart = self._cudart
        start, end = _check(cudart.cudaEventCreate()), _check(cudart.cudaEventCreate())
        try:
            _check(cudart.cudaEventRecord(start, self.stream))
            for _ in range(replays):
                self.replay()
            _check(cudart.cudaEventRecord(end, self.stream))
            _check(cudart.cudaEventSynchronize(end))
            return _check(cudart.cudaEventElapsedTime(start, end)) / 1e3
        finally:
            cudart.cudaEventDestroy(start)
            cudart.cudaEventDestroy(end)

    def __del__(self):
        cudart = getattr(self, "_cudart", None)
        if cudart is None:
            return
        if hasattr(self, "exec"):
            cudart.cudaGraphExecDestroy(self.exec)
        if hasattr(self, "graph"):
            cudart.cudaGraphDestroy(self.graph)
        cudart.cudaStreamDestroy(self.stream)
