"""`benchmarks.weight_stream`'s kernels, emulated on the CPU, against the benchmark's float64 reference: as launches
and as persistent passes whose ring drains at each grid barrier or streams across it, on decoder layers of a small
model and on stages in which some warps have no rows; and the presets' layouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from cuda_emu import Launch, launcher

from benchmarks import weight_stream as ws
from gdn_tvm.config import preset
from gdn_tvm.verify import TOL_OP

SMS = 2  # the emulated GPU's
SOURCE = ws.SOURCE.read_text()
HELPERS, KERNELS = SOURCE.split('extern "C"', 1)[0], SOURCE.split('extern "C"')[1:]


def _source(depth: int) -> str:
    """The helpers and the one kernel of ring depth `depth` (the emulator sizes every kernel's dynamic shared memory
    from the launches it is given)."""
    (kernel,) = [k for k in KERNELS if k.startswith(f" __global__ void weight_stream_d{depth}(")]
    return "#include <cuda.h>\n" + HELPERS + 'extern "C"' + kernel  # the shim, as TVM's preamble includes it


def _small_layers() -> ws.Layout:
    """Two decoder layers of a model small enough to emulate (rows of two lines, down's of three)."""
    cfg = dataclasses.replace(
        preset("qwen3.5-0.8b"), hidden=512, n_k_heads=1, n_v_heads=2, head_v_dim=128, intermediate_size=768
    )
    return ws.decoder_layers(cfg, 2)


def _emulate(layout: ws.Layout, way: ws.Way, arena: np.ndarray) -> list[int]:
    """One pass `way` over `arena` (in place); the barrier's counters after it."""
    table, sync = layout.table(), np.zeros(2, np.int32)
    for grid, first, last, threads in ws.launches(layout, way, SMS):
        kernel = f"weight_stream_d{way.depth}"
        run = launcher(
            _source(way.depth), [Launch(kernel, (0, 1, 2, 3, 4, 5, 6), (grid, 1, 1), (threads, 1, 1), way.shared)]
        )
        run(table, arena, first, last, way.cross, sync, way.x_first)
    return sync.tolist()


WAYS = [
    ws.Way("launches-r4", 4, 4, lines=4),
    ws.Way("launches-r4-xfirst", 4, 4, lines=4, x_first=1),
    ws.Way("pdl-r8", 8, 4, lines=8, pdl=True),  # emulated launches run one after another: as launches-r8
    ws.Way("drain-2x4-d8", 8, 4, ctas=2),
    ws.Way("stream-2x4-d8", 8, 4, ctas=2, cross=1),
    ws.Way("stream-1x2-d24", 24, 2, ctas=1, cross=1),  # a ring longer than a warp's share of most stages
]


@pytest.mark.parametrize("way", WAYS, ids=lambda w: w.name)
def test_decoder_layers_match_float64(way, rng):
    layout = _small_layers()
    start = ws.filled(layout, rng)
    arena = start.copy()
    assert _emulate(layout, way, arena) == [0, 0]
    assert ws.check(layout, start, arena) <= TOL_OP
    weights = np.ones(layout.size, bool)
    for at, n in layout.written():
        weights[at : at + n] = False
    assert np.array_equal(arena[weights], start[weights])  # nothing but outputs and states written


@pytest.mark.parametrize("cross", [0, 1])
def test_warps_without_rows_in_a_stage_keep_the_barrier_and_the_stream(cross, rng):
    layout = ws.Layout(256).gemv(3)  # 3 rows for 16 warps
    layout.gemv(40, cols=256, x=layout.x0).gemv(1, cols=256, x=layout.x0)
    layout.gemv(2 * 128 + 8, cols=256, x=layout.x0).state(2, 4, 1)
    way = ws.Way("stream", 4, 8, ctas=1, cross=cross)
    start = ws.filled(layout, rng)
    arena = start.copy()
    assert _emulate(layout, way, arena) == [0, 0]
    assert ws.check(layout, start, arena) <= TOL_OP


def test_an_unwritten_output_fails_the_check(rng):
    layout = _small_layers()
    start = ws.filled(layout, rng)
    arena = start.copy()
    _emulate(layout, WAYS[0], arena)
    s = layout.stages[3]
    arena[s.y + 4 * 7 : s.y + 4 * 8] = 0xFF  # one row left as the NaN it started as
    assert np.isnan(ws.check(layout, start, arena))
    arena[s.y + 4 * 7 : s.y + 4 * 8].view(np.float32)[0] = 0.5  # a wrong value
    assert ws.check(layout, start, arena) > 1e-3


def test_preset_layers_move_the_layers_bytes():
    cfg = preset("qwen3.5-0.8b")
    layout = ws.decoder_layers(cfg, 8)
    assert len(layout.stages) == 40
    in_proj = 2 * 16 * 128 + 2 * 16 * 128 + 2 * 16
    weights = 2 * 1024 * (in_proj + 2048 + 2 * 3584 + 3584)
    assert sum(s.streamed for s in layout.stages[:5]) == weights + 16 * 128 * 128 * 4
    assert layout.size < 8 * (weights + 16 * 128 * 128 * 4) * 1.01


def test_ways_cover_each_kind_and_a_launch_grid_covers_every_row():
    names = [w.name for w in ws.ways()]
    assert names[0] == "launches-r4" and {"pdl-r16", "drain-1x8-d16", "stream-2x8-d8"} <= set(names)
    layout = ws.decoder_layers(preset("qwen3.5-4b"), 1)
    for grid, first, _, threads in ws.launches(layout, ws.ways()[0], 132):
        s = layout.stages[first]
        per_warp = max(1, min(4 // s.lines, s.rows // (2 * 132 * 8)))
        assert grid * threads // 32 * per_warp >= s.rows > (grid - 1) * threads // 32 * per_warp


def test_the_kernels_compile_for_sm_90():
    assert len(ws.compile_cubin("sm_90")) > 1000


def test_the_benchmark_checks_at_the_op_tolerance():
    assert ws.TOLERANCE == TOL_OP
