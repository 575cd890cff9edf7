"""Programmatic dependent launch (`codegen.pdl`): what a marked kernel runs before its body, its launch tag in a CUDA
build, and that it still computes what its reference does (emulated; the GPU checks a whole model bit for bit,
`benchmarks.launch_modes`)."""

from __future__ import annotations

import re
import shutil

import pytest
import tvm
from conftest import BF16_CASES, CASES, check_kernel_against_reference
from cuda_emu import emulated, lower
from test_export import needs_cuda_export, quiet

from gdn_tvm.codegen import pdl
from gdn_tvm.export.artifact import build
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.module import read_manifest
from gdn_tvm.target import cuda, llvm

CFG = BF16_CASES["0.8b-B1-bf16"]
GEMV = "gemv_gate_up_proj_rmsnorm_swiglu"  # two weights: the projection and the norm's
KERNEL_BODY = re.compile(r'extern "C" __global__ void [^;{]*\{\n(.*?)\n\}', re.S)


def marked(name: str, cfg, prefetch_bytes: int) -> tvm.IRModule:
    op = OPS[name]
    return tvm.IRModule({"main": pdl.mark(op.schedule(cfg, "cuda").mod["main"], op.signature(cfg), prefetch_bytes)})


def kernel_lines(source: str) -> list[list[str]]:
    """Each kernel's body in `source`, as stripped lines."""
    return [[line.strip() for line in body.splitlines()] for body in KERNEL_BODY.findall(source)]


def test_a_marked_kernel_prefetches_its_weights_waits_then_lets_the_next_launch():
    """Each weight's first bytes (capped at the weight) prefetched, then the wait, then the trigger: the first
    statements of the kernel, before anything reads an activation."""
    weights = [a for a in OPS[GEMV].signature(CFG) if a.role == "weight"]
    cap = 1 << 20
    assert [a.name for a in weights] == ["w", "norm_weight"] and weights[0].nbytes > cap > weights[1].nbytes
    source, _ = lower(marked(GEMV, CFG, cap))
    (lines,) = kernel_lines(source)
    assert lines[:4] == [
        f"gdn_prefetch_l2(w_ptr, (int64_t){cap});",
        f"gdn_prefetch_l2(norm_weight_ptr, (int64_t){weights[1].nbytes});",
        "gdn_grid_wait();",
        "gdn_grid_trigger();",
    ]
    assert 'asm volatile("griddepcontrol.wait;" ::: "memory")' in source


def test_without_prefetch_a_kernel_only_waits_and_triggers():
    (lines,) = kernel_lines(lower(marked(GEMV, CFG, 0))[0])
    assert lines[:2] == ["gdn_grid_wait();", "gdn_grid_trigger();"] and "gdn_prefetch_l2" not in "\n".join(lines)


def test_an_unmarked_kernel_is_left_as_it_was():
    source, _ = lower(OPS[GEMV].schedule(CFG, "cuda").mod)
    assert not re.search("gdn_prefetch_l2|gdn_grid_wait|gdn_grid_trigger|griddepcontrol", source)


def test_a_kernel_without_weights_waits_and_triggers_only():
    """The delta rule's state is updated in place: nothing of it is read before the wait."""
    (lines,) = kernel_lines(lower(marked("delta_rule", CASES["0.8b-B1"], 1 << 20))[0])
    assert lines[:2] == ["gdn_grid_wait();", "gdn_grid_trigger();"] and "gdn_prefetch_l2" not in "\n".join(lines)


def test_negative_prefetch_is_refused():
    with pytest.raises(ValueError, match="prefetch_bytes must be >= 0"):
        marked(GEMV, CFG, -1)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not on PATH (it builds the emulated kernels)")
@pytest.mark.parametrize("name", [GEMV, "gemv_down_proj_residual", "delta_rule_fused"])
def test_a_marked_kernel_matches_its_reference(name, rng):
    """The wait, trigger and prefetches change when a kernel runs, not what it computes (emulated: no-ops)."""
    kernel = emulated(OPS[name], CFG, *lower(marked(name, CFG, 1 << 20)))
    check_kernel_against_reference(OPS[name], CFG, kernel, rng)


@needs_cuda_export
def test_a_cuda_build_records_programmatic_launch(tmp_path):
    """`build(prefetch_bytes=N)`: the manifest says so and every kernel of the library carries the launch tag that
    makes TVM's runtime launch it programmatically; a plain build has neither."""
    names = ["gemv_down_proj_residual", "sigmoid_gate"]
    build(CFG, cuda(), tmp_path / "logs", tmp_path / "pdl", True, names, echo=quiet, prefetch_bytes=4096)
    build(CFG, cuda(), tmp_path / "logs", tmp_path / "plain", True, names, echo=quiet)
    for root, setting, tags in (("pdl", {"prefetch_bytes": 4096}, len(names)), ("plain", None, 0)):
        file, manifest = read_manifest(tmp_path / root, CFG, "cuda")
        assert manifest["programmatic_launch"] == setting
        assert (file.parent / manifest["library"]).read_bytes().count(pdl.LAUNCH_TAG.encode()) == tags


def test_programmatic_launch_is_for_cuda_builds(tmp_path):
    with pytest.raises(ValueError, match="programmatic dependent launch is for CUDA builds, not llvm"):
        build(CFG, llvm(), tmp_path / "logs", tmp_path, True, ["sigmoid_gate"], echo=quiet, prefetch_bytes=0)
