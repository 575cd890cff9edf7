"""The search space of a workload: the hand schedule over its whole knob grid AND MetaSchedule's default rules.

A schedule module may export `KNOBS` (for its `cuda` function) and `LLVM_KNOBS` (for `llvm`): dicts of knob
name -> tuple of values, or tuples of such dicts (the union of their grids). Every combination of a grid, plus the
defaults, is one hand design; combinations the hand schedule rejects for this shape, or that repeat an earlier
design, are dropped and counted. The grids are small (at most a few dozen), so the driver measures every design
directly rather than sampling them; the evolutionary search over `PostOrderApply` then starts from the best of them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import tvm_ffi
from tvm import s_tir
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from gdn_tvm.registry import Op
from gdn_tvm.tuning.workload import Workload

# What a hand schedule may raise for a knob combination that does not fit the shape.
REJECTED = (s_tir.ScheduleError, ValueError, AssertionError)


def knob_grid(op: Op, kind: str) -> list[dict[str, object]]:
    """The defaults (`{}`) followed by every combination of `op`'s schedule-module grid for target kind `kind` (of
    each grid in turn, where the module gives a tuple of them)."""
    grids = op.knobs.get(kind, {})
    combos: list[dict[str, object]] = [{}]
    for grid in grids if isinstance(grids, tuple) else (grids,):
        combos += [dict(zip(grid, values, strict=True)) for values in itertools.product(*grid.values())] if grid else []
    return combos


def apply_hand(w: Workload, sch: s_tir.Schedule, **knobs) -> None:
    """The hand schedule applied to `sch`, its trace never empty.

    A hand schedule may leave the definition as written (llvm decode attention); MetaSchedule counts a record
    with an empty trace as invalid, so the root block is looked up first (an instruction that changes nothing).
    """
    sch.get_sblock("root")
    w.op.schedules[w.kind](sch, w.cfg, **knobs)


def hand_designs(w: Workload, sch: s_tir.Schedule) -> tuple[list[s_tir.Schedule], int]:
    """One schedule per knob combination applied to copies of `sch`, and how many combinations were dropped:
    rejected by the schedule, or giving the same program as an earlier one (a knob another stage ignores, as the
    split-KV reduce ignores `warps`, or one clamped to the shape)."""
    designs, seen, dropped = [], set(), 0
    for knobs in knob_grid(w.op, w.kind):
        design = sch.copy()
        try:
            apply_hand(w, design, **knobs)
        except REJECTED:
            dropped += 1
            continue
        program = tvm_ffi.structural_hash(design.mod)
        if program in seen:
            dropped += 1
            continue
        seen.add(program)
        designs.append(design)
    return designs, dropped


def hand_schedule(w: Workload) -> s_tir.Schedule:
    """The hand schedule with default knobs on the tuning task (what `tuned >= hand` is measured against)."""
    sch = s_tir.Schedule(w.mod)
    apply_hand(w, sch)
    return sch


@dataclass(frozen=True)
class Space:
    """What MetaSchedule searches beside the hand designs (which the driver measures directly, every knob
    combination): `generator`, the target's default rules, or None where they reject the workload; and a `note`
    on what of MetaSchedule's defaults was left out."""

    generator: ms.space_generator.SpaceGenerator | None
    note: str


def design_space(w: Workload, target: Target) -> Space:
    """`PostOrderApply` with the target's default rules, less what fails on the hand designs:

    - the evolutionary search seeds its population from the best records, the measured hand designs among them,
      and runs the postprocessors on them: one that raises on a hand design (RewriteUnboundBlock on a block bound
      to blockIdx alone, as in the recurrent update) would abort the whole search, so it is dropped;
    - an op whose CTAs meet at an arrival counter (a `counter` argument) is searched over its knob grid only;
    - where the default rules raise (e.g. `reverse_compute_at` over the recurrent update, or an index out of
      bounds inside the generator on the out_proj GEMV with its norm prologue), or make a trace that does not
      print (on the split-KV reduce, `SamplePerfectTile` yields one integer object twice and the printer rejects
      it as a variable produced twice), there is no search.
    """
    if any(a.role == "counter" for a in w.op.signature(w.cfg)):
        # its CTAs meet at a counter (`ops.common.arrive`): a rule binding the arriving loop to threads would put the
        # helper's barrier in divergent code (a hang), a CPU one running it in parallel would take the last arrival
        # early; its knob grid keeps the loop a grid (CUDA) or serial (CPU)
        return Space(None, "knob grid only (its CTAs meet at an arrival counter)")
    ctx = ms.TuneContext(w.mod, target=target, space_generator="post-order-apply", task_name=w.op.name)
    postprocs, raising = [], []
    for postproc in ctx.space_generator.postprocs:
        try:
            postproc.apply(hand_schedule(w))
        except RuntimeError:
            raising.append(type(postproc).__name__)
            continue
        postprocs.append(postproc.clone())
    notes = [f"dropped {', '.join(raising)} (raises on the hand design)"] if raising else []
    try:
        for sch in ctx.generate_design_space():
            sch.trace.as_python()  # the search prints every trace it measures
    except (RuntimeError, ValueError, IndexError) as err:  # ScheduleError, TVM check failures, generator crashes
        notes.append(f"default rules rejected ({first_line(err)})")
        return Space(None, "; ".join(notes))
    return Space(ms.space_generator.PostOrderApply(postprocs=postprocs), "; ".join(notes))


def first_line(err: Exception) -> str:
    """The first line of a TVM error message (they run to pages of IR)."""
    return str(err).strip().splitlines()[0]
