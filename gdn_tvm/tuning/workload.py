"""What is tuned for one registry op: its definition marked no-alias, and valid index values.

The best trace is later replayed on the general function (same blocks and loops; an in-place op keeps its
aliased state). Index buffers hold a decode step's typical values: every lane active on distinct slots, positions
at the middle of the cache. An attention step's cost is affine in its position, so over a sequence that fills the
cache the mean step is the middle one, and the design ranked first there is the fastest over the sequence. The
ranks differ: qwen3.5-4b's 32k split-KV at B=1 on the H200 takes 46.5 us with 8 warps a CTA at mid-cache against
64.4 with 2, while at the last row 2 warps win (77.4 against 84.3 us).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import tirx

from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import Op
from gdn_tvm.signature import Arg


@dataclass(frozen=True)
class Workload:
    """`general`: the op's PrimFunc; `mod`: `{"main": general marked no-alias}`, the tuning task;
    `index_values`: per parameter of `mod`, the values of an index buffer or a counter, or None."""

    op: Op
    cfg: DecodeConfig
    kind: str
    general: tirx.PrimFunc
    mod: tvm.IRModule
    index_values: tuple[np.ndarray | None, ...]

    @property
    def key(self) -> str:
        return self.op.workload_key(self.cfg, self.kind)


def workload(op: Op, cfg: DecodeConfig, kind: str) -> Workload:
    """The tuning task of `op` at `cfg` for target kind `kind`."""
    general = op.definition(cfg)
    signature = op.signature(cfg)
    if len(signature) != len(general.params):
        raise ValueError(f"{op.name}: signature has {len(signature)} args, the PrimFunc {len(general.params)}")
    # MetaSchedule's TuneContext marks every task no-alias; the task is that very function so records match.
    mod = tvm.IRModule({"main": general.with_attr("tirx.noalias", True)})
    return Workload(op, cfg, kind, general, mod, tuple(_index_values(a) for a in signature))


def _index_values(arg: Arg) -> np.ndarray | None:
    """An index buffer's values while tuning: slots 0, 1, ... (distinct while the pool lasts), positions at the
    middle of their range; arrival counters zero (each launch leaves them so); None for any other argument."""
    if arg.role == "counter":
        return np.zeros(arg.shape, arg.dtype)
    if arg.role != "index":
        return None
    lo, hi = arg.limits
    if arg.slot_pool:
        return (np.arange(arg.shape[0]) % hi).astype(arg.dtype)
    return np.full(arg.shape, (lo + hi) // 2, dtype=arg.dtype)
