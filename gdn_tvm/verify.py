"""The numerics contract (docs/math.md) and the check of a compiled kernel against its float64 reference, shared by the
tests and the tuner (MetaSchedule times candidates; it does not check what they compute).

Relative L-infinity `max|out - ref| / max|ref|`: per op <= `TOL_OP`, per layer and over decode steps
<= `TOL_LAYER` where every tensor is float32, looser where one is stored in bf16 (`TOLERANCES`); data movement
(`Op.exact`) bit for bit. NaN only (and exactly) where the reference is NaN: outputs
start NaN-poisoned, so an element a kernel leaves unwritten shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import ml_dtypes
import numpy as np
import tvm

from gdn_tvm.config import DecodeConfig
from gdn_tvm.registry import Op
from gdn_tvm.runtime.kernel import Kernel
from gdn_tvm.signature import is_float, sample, visible

# (per op, per layer over decode steps) by storage dtype; a check takes the loosest of the dtypes it involves. The
# references round where the kernels store, so what is left is float32 arithmetic (and, over steps, a KV value
# rounded to the other bf16 neighbour where float32 and float64 differ across a rounding midpoint: 2^-8 relative).
TOLERANCES = {"float32": (1e-4, 1e-3), "bfloat16": (1e-3, 5e-3)}
TOL_OP, TOL_LAYER = TOLERANCES["float32"]


def tolerance(dtypes: Iterable[str], layer: bool = False) -> float:
    """The per-op (or, with `layer`, per-layer) tolerance of a check involving tensors stored in `dtypes`."""
    return max(TOLERANCES[d][layer] for d in set(dtypes) if d in TOLERANCES)


def mismatch(out: np.ndarray, ref: np.ndarray, tol: float) -> str | None:
    """Why `out` does not match `ref` within relative L-infinity `tol` (`tol == 0`: bit-identical), or None.

    A computed output stored in bf16 (`tol > 0`) may also sit one bf16 ulp from the reference element: where the
    kernel's float32 value and the reference's float64 one straddle a rounding midpoint, the two round to
    neighbours 2^-8 apart (relative), far above `tol`; the error is measured beyond that ulp."""
    ulps = np.asarray(out).dtype == ml_dtypes.bfloat16 and tol > 0
    out, ref = (np.asarray(a, np.float64) if is_float(np.asarray(a).dtype) else np.asarray(a) for a in (out, ref))
    if out.shape != ref.shape:
        return f"shape {out.shape} != {ref.shape}"
    ref_nan, out_nan = np.isnan(ref), np.isnan(out)
    if (out_nan != ref_nan).any():
        return (
            f"{int((out_nan & ~ref_nan).sum())} unwritten/NaN elements, "
            f"{int((ref_nan & ~out_nan).sum())} written where they must stay untouched"
        )
    if tol == 0:
        diff = np.flatnonzero((out != ref) & ~ref_nan)
        return f"{diff.size} elements differ (first at flat index {diff[0]})" if diff.size else None
    o, r = out[~ref_nan].astype(np.float64), ref[~ref_nan].astype(np.float64)
    scale = np.abs(r).max() if r.size else 0.0
    if scale == 0:
        return "reference is all zeros; the check draws no signal"
    diff = np.abs(o - r)
    if ulps:  # one bf16 ulp of each reference element: 2^(e-8) for |r| in [2^(e-1), 2^e); none at r == 0
        diff = np.maximum(diff - np.where(r == 0, 0.0, np.ldexp(1.0, np.frexp(r)[1] - 8)), 0.0)
    err = diff.max() / scale
    beyond = " beyond one bf16 ulp" if ulps else ""
    return f"relative L-inf error{beyond} {err:.3e} > {tol:.0e}" if err > tol else None


def reference_copy(values: Mapping[str, np.ndarray]) -> dict:
    """float64 copies of float arrays, copies of int arrays."""
    return {k: _float64_copy(v) for k, v in values.items()}


def _float64_copy(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float64) if is_float(v.dtype) else np.copy(v)


def check_kernel(op: Op, cfg: DecodeConfig, kernel: Kernel, rng: np.random.Generator) -> list[str]:
    """Run `kernel` (a build of `op` at `cfg`) on fresh random inputs on its device and compare every output and
    state with the float64 reference within `tolerance` of the op's dtypes; one message per argument that differs
    (none: it matches)."""
    device = tvm.device(*kernel.device)
    args = visible(op.signature(cfg))
    values = {a.name: sample(a, rng) for a in args}
    expect = reference_copy(values)
    op.run_reference(cfg, expect)
    tensors = {k: tvm.runtime.tensor(v, device) for k, v in values.items()}
    kernel(**tensors)
    failed, tol = [], 0 if op.exact else tolerance(a.dtype for a in args)
    for a in args:
        if a.role in ("out", "state", "counter"):
            why = mismatch(tensors[a.name].numpy(), expect[a.name], tol)
            if why:
                failed.append(f"{op.name}.{a.name}: {why}")
    return failed
