"""Every op's CUDA hand schedule run on the CPU (`cuda_emu`: the generated CUDA C++ under a shim, block threads as
fibers in lockstep at barriers and shuffles) against its float64 reference, so the GPU kernels' numerics are checked
without a GPU; and wrong kernels fail the same check."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import tvm
from conftest import (
    BF16_CASES,
    CASES,
    COMMITTED_BF16_MODEL_RECORDS,
    COMMITTED_BF16_STEP_LOGS,
    COMMITTED_CUDA_LOGS,
    CUDA_OPS,
    REPO,
    TUNED,
    assert_kv_rows_round_to_nearest_even,
    check_kernel_against_reference,
    reads_dtype,
)
from cuda_emu import Launch, NotEmulated, emulated, launcher, lower

from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.export.artifact import schedule_ops
from gdn_tvm.plan import step_ops
from gdn_tvm.registry import OPS
from gdn_tvm.tuning.space import knob_grid
from gdn_tvm.verify import check_kernel

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH (it builds the emulated kernels)")

# Every op at two presets (Hv != Hk; B = 3 skips a lane; a GEMV takes 0.3 to 3 s), the ops whose reference takes
# the head mapping at the tiled one too, and the ops that read a storage dtype at the bf16 cases.
EMULATED = [(name, case) for case in ("0.8b-B1", "4b-B3") for name in CUDA_OPS] + [
    (name, "4b-B1-tiled") for name, op in CUDA_OPS.items() if "head_mapping" in op.ref_params
]
EMULATED += [(name, case) for case in BF16_CASES for name, op in CUDA_OPS.items() if reads_dtype(op, BF16_CASES[case])]


@pytest.mark.parametrize(("name", "case"), EMULATED)
def test_cuda_kernel_matches_reference(name, case, rng):
    op, cfg = OPS[name], (CASES | BF16_CASES)[case]
    try:
        kernel = emulated(op, cfg, *lower(op.schedule(cfg, "cuda").mod))
    except NotEmulated as why:
        pytest.skip(f"{name}: not emulated: {why}")
    check_kernel_against_reference(op, cfg, kernel, rng)


def test_bf16_kv_rows_round_to_nearest_even(rng):
    """The CUDA scatter's conversions (`(nv_bfloat16)` of a float: `cvt.rn.bf16.f32`, the shim's bit arithmetic)
    round ties to even, overflow to inf and keep subnormals as numpy does."""
    op, cfg = OPS["kv_row_scatter"], BF16_CASES["4b-B3-bf16"]
    assert_kv_rows_round_to_nearest_even(emulated(op, cfg, *lower(op.schedule(cfg, "cuda").mod)), cfg, rng)


@pytest.mark.parametrize("case", ["0.8b-B1", "4b-B1-32k"])  # the B=32 shapes pass too, in 2 and 4 minutes more
@pytest.mark.parametrize("name", TUNED)
def test_committed_h200_record_kernel_matches_reference(name, case, rng):
    """The kernel `make build` makes of the committed H200 record, at the record's own shape, against the
    reference: what the GPU test of the committed logs checks, here in CI."""
    op, cfg = OPS[name], COMMITTED_CUDA_LOGS[case]
    (scheduled,) = schedule_ops(cfg, "cuda", REPO / "tuning_logs", [name], allow_hand=False)
    kernel = emulated(op, cfg, *lower(tvm.IRModule({"main": scheduled.func})))
    check_kernel_against_reference(op, cfg, kernel, rng)


@pytest.mark.parametrize("case", list(COMMITTED_BF16_STEP_LOGS))
def test_committed_bf16_step_records_match_reference(case, rng):
    """The kernels of the default (bf16) step's committed H200 records, emulated, against the reference."""
    cfg = COMMITTED_BF16_STEP_LOGS[case]
    for scheduled in schedule_ops(cfg, "cuda", REPO / "tuning_logs", step_ops(cfg), allow_hand=False):
        op = OPS[scheduled.name]
        check_kernel_against_reference(op, cfg, emulated(op, cfg, *lower(tvm.IRModule({"main": scheduled.func}))), rng)


@pytest.mark.parametrize("batch", [1, 8])  # B=32 and up pass too, in minutes
@pytest.mark.parametrize("name", ["delta_rule", "delta_rule_fused"])
def test_committed_bf16_state_records_match_reference(name, batch, rng):
    """The recurrence's committed H200 records at a bf16 state (qwen3.5-4b), emulated, against the reference."""
    cfg = DecodeConfig(preset("qwen3.5-4b"), batch=batch, state_dtype="bfloat16")
    (scheduled,) = schedule_ops(cfg, "cuda", REPO / "tuning_logs", [name], allow_hand=False)
    op = OPS[name]
    check_kernel_against_reference(op, cfg, emulated(op, cfg, *lower(tvm.IRModule({"main": scheduled.func}))), rng)


@pytest.mark.parametrize(
    ("case", "name"), [(case, name) for case, (_, names) in COMMITTED_BF16_MODEL_RECORDS.items() for name in names]
)
def test_committed_bf16_model_records_match_reference(case, name, rng):
    """The kernel of a whole-model op's committed H200 record (one the mixer step does not launch), emulated, against
    the reference."""
    cfg, _ = COMMITTED_BF16_MODEL_RECORDS[case]
    (scheduled,) = schedule_ops(cfg, "cuda", REPO / "tuning_logs", [name], allow_hand=False)
    op = OPS[name]
    check_kernel_against_reference(op, cfg, emulated(op, cfg, *lower(tvm.IRModule({"main": scheduled.func}))), rng)


@pytest.mark.parametrize("name", [n for n, op in OPS.items() if op.family == "decode_attention"])
def test_attention_knob_grid_is_refused_or_right_on_short_chunks(name, rng):
    """Every design of the knob grid at 16-row chunks, shorter than the largest designs' step of warps x positions
    rows, is refused by the schedule or matches the reference: rows past the chunk once stored their scores into the
    next query head's (`schedules.decode_attention._fit_chunk`)."""
    assert _knob_grid_checked(OPS[name], CASES["4b-B3"], rng), "every design refused"


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", [n for n, op in OPS.items() if op.family == "delta_rule"])
def test_delta_rule_knob_grid_is_refused_or_right(name, state_dtype, rng):
    """Every design of the recurrence's knob grid (what the tuner measures and the sweep times) is refused by the
    schedule or matches the reference, at either state dtype (a bf16 state's defaults are designs of the grid)."""
    op = OPS[name]
    right = _knob_grid_checked(op, CASES["4b-B3"].replace(state_dtype=state_dtype), rng)
    assert right == len(knob_grid(op, "cuda")), "a design of the grid was refused at a shape every design fits"


@pytest.mark.parametrize(
    ("name", "batch", "changes"),
    [
        ("gemv_in_proj_b", 8, {"weight_dtype": "bfloat16"}),  # SMALL_LANES: a warp a row, one row a CTA
        ("gemv_out_proj", 4, {"weight_dtype": "bfloat16"}),  # the same, 1,024 CTAs
        ("gemv_lm_head", 16, {"vocab_size": 4099, "hidden": 256}),  # 8+ lanes, rows a thread dividing N: 1
    ],
)
def test_batched_gemv_defaults_match_reference(name, batch, changes, rng):
    """The default CUDA layouts of the batched GEMVs the step keeps beside its library GEMMs (4-15 lanes, small
    weights), and of a GEMV whose rows 4 do not divide, against the reference."""
    op, cfg = OPS[name], CASES["0.8b-B1"].replace(batch=batch, slots=batch, **changes)
    check_kernel_against_reference(op, cfg, emulated(op, cfg, *lower(op.schedule(cfg, "cuda").mod)), rng)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_swiglu_knob_grid_is_refused_or_right(dtype, rng):
    """Every design of the GEMV knob grid on the SwiGLU variant (what the tuner measures) matches the reference, or
    is refused where its rows do not split into rows a thread or its CTA would exceed 1024 threads, and every
    tensor-core design (3 lanes are no whole 16-lane tile). An MLP of I = 512 keeps the grid quick (K = 2560: some
    designs' K steps predicated)."""
    op = OPS["gemv_gate_up_proj_swiglu"]
    cfg = CASES["4b-B3"].replace(intermediate_size=512, weight_dtype=dtype)
    fits = [
        k
        for k in knob_grid(op, "cuda")[1:]
        if not k["tensor_cores"]
        and k["rows"] % k["rows_per_thread"] == 0
        and k["rows"] // k["rows_per_thread"] * k["threads_per_row"] <= 1024
    ]
    assert _knob_grid_checked(op, cfg, rng) == 1 + len(fits)


@pytest.mark.parametrize(
    ("name", "changes"),
    [
        ("gemv_gate_up_proj_rmsnorm_swiglu", {"intermediate_size": 512}),
        ("gemv_out_proj_norm_residual", {"hidden": 256}),
    ],
)
def test_block_stage_knob_grids_are_refused_or_right(name, changes, rng):
    """Every CUDA-core design of the GEMV knob grid on a prologue variant (rmsnorm + SwiGLU, gated norm + residual)
    matches the reference, or is refused where it has no stage for x (one row a CTA), its rows do not split into rows
    a thread, its CTA would exceed 1024 threads, or its threads do not divide what its prologue sums (the whole row:
    K; a head: Dv)."""
    op, cfg = OPS[name], CASES["4b-B3"].replace(weight_dtype="bfloat16", **changes)
    n_rows, n_cols = cfg.model.projections[op.flags["proj"]]
    n_rows //= 2 if op.flags.get("swiglu") else 1

    def fits(k: dict) -> bool:
        threads = k["rows"] // k["rows_per_thread"] * k["threads_per_row"]
        summed = n_cols if op.flags.get("rmsnorm") else cfg.model.head_v_dim
        split = threads if op.flags.get("rmsnorm") else k["threads_per_row"]
        return k["rows"] > 1 and k["rows"] % k["rows_per_thread"] == 0 and threads <= 1024 and summed % split == 0

    designs = [k for k in knob_grid(op, "cuda")[1:] if not k["tensor_cores"] and n_rows % k["rows"] == 0]
    assert _knob_grid_checked(op, cfg, rng) == 1 + sum(map(fits, designs))


def _knob_grid_checked(op, cfg, rng) -> int:
    """How many designs of `op`'s CUDA knob grid the schedule accepts at `cfg`; each of them must match the
    reference in the emulation."""
    right = 0
    for knobs in knob_grid(op, "cuda"):
        try:
            mod = op.schedule(cfg, "cuda", **knobs).mod
        except (ValueError, tvm.s_tir.ScheduleError):
            continue
        failed = check_kernel(op, cfg, emulated(op, cfg, *lower(mod)), rng)
        assert not failed, f"{knobs}: {failed}"
        right += 1
    return right


def _edit(old: str, new: str):
    """A break: the first `old` of the source replaced by `new`."""
    return lambda source, launches: (source.replace(old, new, 1), launches)


def _half_grid(source, launches):
    return source, [dataclasses.replace(x, grid=(x.grid[0] // 2, *x.grid[1:])) for x in launches]


# A GEMV of 256 threads a row (a shuffle tree a warp, the warps' sums staged in shared memory behind a barrier, a
# shuffle tree over them), broken, and what the reference check reports.
WRONG = {
    "shuffle-offset": (_edit("red_buf0_ptr[0], 1, 32)", "red_buf0_ptr[0], 2, 32)"), "relative L-inf error"),
    "no-barrier": (_edit("__syncthreads();", ""), "relative L-inf error"),  # staged sums read before written
    "half-grid": (_half_grid, "unwritten"),
    # x's 1024 floats read from their end on: the guard zone's NaN reaches every row
    "read-past-x": (_edit("(x_ptr + (((int)threadIdx.x) * 4))", "(x_ptr + 1024 + (((int)threadIdx.x) * 4))"), "NaN"),
}
# Broken so that a GPU would hang, leave it undefined or corrupt other memory: the launch stops with the reason.
STOPPED = {
    "divergent-barrier": (_edit("__syncthreads();", "if (threadIdx.x < 32) __syncthreads();"), "divergent code"),
    "early-exit": (
        _edit("y_rf_local_ptr[0] = 0", "if (threadIdx.x >= 32) return;\n  y_rf_local_ptr[0] = 0"),
        "deadlock",
    ),
    "write-past-y": (_edit("y_ptr[((int)blockIdx.x)]", "y_ptr[((int)blockIdx.x) + 16]"), "wrote outside"),
}


def _broken(break_, rng):
    """`gemv_in_proj_b` at 0.8b B=1 (16 rows) broken by `break_`, checked against its reference."""
    op, cfg = OPS["gemv_in_proj_b"], CASES["0.8b-B1"]
    source, launches = lower(op.schedule(cfg, "cuda").mod)
    broken = break_(source, launches)
    assert broken != (source, launches), "the break changed nothing"
    return check_kernel(op, cfg, emulated(op, cfg, *broken), rng)


@pytest.mark.parametrize("case", WRONG)
def test_wrong_kernel_fails_the_check(case, rng):
    break_, expect = WRONG[case]
    failed = _broken(break_, rng)
    assert len(failed) == 1 and expect in failed[0], failed


@pytest.mark.parametrize("case", STOPPED)
def test_undefined_kernel_stops_with_the_reason(case, rng):
    break_, expect = STOPPED[case]
    with pytest.raises(RuntimeError, match=expect):
        _broken(break_, rng)


SHUFFLES = """#include <cuda.h>
extern "C" __global__ void __launch_bounds__(64) shuffles(int* out) {
  int t = threadIdx.x, v = t * t, sum = v;
  out[t] = __shfl_sync(__activemask(), v, 21, 16);
  out[64 + t] = __shfl_down_sync(__activemask(), v, 3, 8);
  out[128 + t] = __shfl_up_sync(__activemask(), v, 3, 8);
  out[192 + t] = __shfl_xor_sync(__activemask(), v, 9, 16);
  for (int m = 16; m >= 1; m /= 2) sum += __shfl_xor_sync(__activemask(), sum, m, 32);
  out[256 + t] = sum;
}
"""


def test_shuffles_follow_cuda_lane_arithmetic():
    """Two warps: each shuffle reads within the caller's warp and `width`-wide segment (a source past the segment:
    the lane's own value; `__shfl_sync`'s source lane taken modulo the width), and a butterfly of shuffles sums the
    warp in every lane (consecutive shuffles in lockstep)."""
    out = np.full(5 * 64, -1, np.int32)
    launcher(SHUFFLES, [Launch("shuffles", (0,), (1, 1, 1), (64, 1, 1))])(out)
    t = np.arange(64)
    v, lane, warp = t * t, t % 32, t - t % 32
    expect = [
        v[t - t % 16 + 21 % 16],
        v[np.where(t % 8 + 3 < 8, t + 3, t)],
        v[np.where(t % 8 >= 3, t - 3, t)],
        v[np.where((lane ^ 9) < lane - lane % 16 + 16, warp + (lane ^ 9), t)],
        np.repeat([v[:32].sum(), v[32:].sum()], 32),
    ]
    np.testing.assert_array_equal(out.reshape(5, 64), expect)
