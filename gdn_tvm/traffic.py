"""The bytes one launch of an op moves, and how many input sets a timed graph rotates over so that repeated
launches read from DRAM, not L2: the op benchmark and the CUDA tuner time under the same conditions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gdn_tvm.config import DecodeConfig
from gdn_tvm.target import DEFAULT_GPU, GpuSpec

if TYPE_CHECKING:  # the registry needs the compiler; the benchmarks' timing imports this module without it
    from gdn_tvm.registry import Op

LAUNCHES = 24  # launches per timed CUDA graph, rotating over the input sets
ROW_WRITERS = ("kv_row_scatter", "attention_prologue")  # op families that write one KV row a lane and read none


def traffic(op: Op, cfg: DecodeConfig) -> int:
    """Bytes one launch must move: inputs and outputs once, touched state rows read and written,
    the KV rows up to the position for attention, one row per lane for the `ROW_WRITERS` and of the embedding table (a
    SwiGLU GEMV's output is its `[B, I]` product: the gate and up projections stay in the kernel)."""
    total = 0
    for a in op.signature(cfg):
        if a.alias is not None:
            continue
        if "cache" in a.name:  # [S, L, Hkv, D] in kv_dtype: a lane's row at one position is a.nbytes / (S * L)
            row = a.nbytes // (a.shape[0] * a.shape[1])
            total += cfg.batch * row * (1 if op.family in ROW_WRITERS else cfg.max_len)
        elif a.role == "state":
            total += 2 * a.nbytes * cfg.batch // cfg.slots
        elif op.family == "embedding" and a.role == "weight":
            total += cfg.batch * a.nbytes // a.shape[0]
        else:
            total += a.nbytes
    return total


def rotating_sets(bytes_per_launch: int, gpu: GpuSpec = DEFAULT_GPU) -> int:
    """Input sets to rotate through so one graph's working set is >= 3x `gpu`'s L2 (at most LAUNCHES)."""
    return max(1, min(LAUNCHES, -(-3 * gpu.l2_bytes // max(bytes_per_launch, 1))))
