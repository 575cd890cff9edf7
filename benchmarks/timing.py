"""CUDA-graph timing with CUDA events, over rotating input sets so repeated launches don't hit in L2; of one launch
of a runtime plan on its own buffers; and of one replay of a captured graph (`replayed_us`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from gdn_tvm.runtime.graph import CudaGraph
from gdn_tvm.traffic import LAUNCHES

REPEATS = 25


def time_graph(fn: Callable[[int], None], sets: int) -> float:
    """Median microseconds per launch of `fn(i % sets)` replayed as a CUDA graph of LAUNCHES launches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(sets):
            fn(i)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(LAUNCHES):
            fn(i % sets)
    graph.replay()
    torch.cuda.synchronize()
    return _median_events(graph.replay, LAUNCHES)


def time_launch(func: Callable, args: list) -> float:
    """Median microseconds of `func(*args)` on TVM tensors (a plan's launch, L2-hot as inside a step): LAUNCHES
    launches captured as one graph through the runtime's own capture, which a torch capture stream never sees;
    median of REPEATS replays."""
    graph = CudaGraph(lambda: [func(*args) for _ in range(LAUNCHES)], LAUNCHES)
    graph.replay()
    return statistics.median(graph.elapsed(1) for _ in range(REPEATS)) * 1e6 / LAUNCHES


def replayed_us(graph: CudaGraph, replays: int = 20, samples: int = 9) -> float:
    """Median microseconds of one replay of `graph`, over `samples` runs of `replays` back-to-back replays."""
    graph.replay()
    times = sorted(graph.elapsed(replays) / replays for _ in range(samples))
    return round(times[samples // 2] * 1e6, 2)


def time_eager(fn: Callable[[int], None], sets: int) -> float:
    """Median microseconds per call of `fn(i % sets)` launched eagerly (Python and launch overhead included)."""
    for i in range(sets):
        fn(i)
    torch.cuda.synchronize()

    def burst():
        for i in range(LAUNCHES):
            fn(i % sets)

    return _median_events(burst, LAUNCHES)


def _median_events(run: Callable[[], None], per: int) -> float:
    times: list[float] = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / per)
    return statistics.median(times)


def gbps(nbytes: int, us: float) -> float:
    return nbytes / us / 1e3
