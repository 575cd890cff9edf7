"""Build and export (`make build`): strict record lookup, manifest, loading with the TVM runtime alone, the CUDA
export with compiled device code (stub driver + NVRTC on a CPU machine), and the committed H200 logs on a GPU."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tvm
from conftest import (
    COMMITTED_BF16_STEP_LOGS,
    COMMITTED_BF16_WIDE_STEP_LOGS,
    COMMITTED_CUDA_LOGS,
    F32,
    REPO,
    TUNED,
    check_kernel_against_reference,
)
from test_layers import assert_decodes_like_reference, assert_preset_stack_decodes

from gdn_tvm.codegen.library import export_library
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.export import artifact
from gdn_tvm.export.__main__ import main as build_main
from gdn_tvm.export.artifact import build, dlight_ops, schedule_ops
from gdn_tvm.plan import LIBRARY_GEMM_LANES, step_ops
from gdn_tvm.registry import OPS
from gdn_tvm.runtime import cublas
from gdn_tvm.runtime.module import ManifestError, check_library, digest, load, read_manifest
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.signature import ArgumentError
from gdn_tvm.target import cuda, gpu_present, llvm
from gdn_tvm.tuning.driver import workloads
from gdn_tvm.tuning.records import MissingRecordError, TuningLogError

CFG = DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=64, **F32)


def quiet(_line: str) -> None:
    """Swallows the build summary line."""


def can_export_cuda() -> bool:
    """A CUDA export compiles here: gcc builds the stub driver, NVRTC finds the CUDA headers."""
    headers = Path(os.environ.get("CUDA_PATH", "/usr/local/cuda"), "include", "cuda.h")
    return bool(shutil.which("gcc")) and headers.exists()


needs_cuda_export = pytest.mark.skipif(
    not can_export_cuda(), reason="no gcc (for the stub driver) or no CUDA headers (for NVRTC)"
)


def test_dtype_options_build_a_bf16_module_under_its_own_name(tmp_path, rng):
    """`make build --weight-dtype bfloat16 --kv-dtype bfloat16`: a build folder named by its dtypes whose kernels take
    bf16 weights and caches and match the references; the float32 configuration finds no build there."""
    cfg = CFG.replace(weight_dtype="bfloat16", kv_dtype="bfloat16")
    names = ["kv_row_scatter", "gemv_in_proj_b"]
    argv = ["--target", "llvm", "--max-len", "64", "--weight-dtype", "bfloat16", "--kv-dtype", "bfloat16"]
    argv += ["--ops", ",".join(names), "--allow-hand", "--work-dir", str(tmp_path / "logs"), "--out", str(tmp_path)]
    assert build_main(argv) == 0
    assert (tmp_path / "llvm" / "qwen3.5-0.8b-B1-S1-L64-sl128-grouped-wbf16-kvbf16" / "manifest.json").is_file()
    kernels = load(tmp_path, cfg, "llvm")
    for name in names:
        assert {a.dtype for a in kernels[name].signature} >= {"bfloat16"}
        check_kernel_against_reference(OPS[name], cfg, kernels[name], rng)
    with pytest.raises(ManifestError, match="no manifest.json"):
        load(tmp_path, CFG, "llvm")


def test_missing_record_is_an_error_naming_each_workload(tmp_path):
    names = ["sigmoid_gate", "gemv_k_proj", "gemv_v_proj"]  # the two gemvs share one workload
    with pytest.raises(MissingRecordError, match="2 workload") as err:
        build(CFG, llvm(), tmp_path / "logs", tmp_path / "build", names=names, echo=quiet)
    for name in ("sigmoid_gate", "gemv_k_proj"):
        assert str(err.value).count(f"workload {OPS[name].workload_key(CFG, 'llvm')} ") == 1
    assert not (tmp_path / "build").exists()


def test_allow_hand_builds_counts_and_matches_reference(tmp_path, rng):
    names = ["sigmoid_gate", "kv_row_scatter", "delta_rule"]  # index buffers; a state updated in place
    lines = []
    path = build(CFG, llvm(), tmp_path / "logs", tmp_path, allow_hand=True, names=names, echo=lines.append)
    manifest = json.loads(path.read_text())
    assert manifest["hand_schedules"] == names and "3 hand" in lines[0]
    assert {f["schedule"] for f in manifest["functions"].values()} == {"hand"}
    kernels = load(tmp_path, CFG, "llvm")
    for name in names:
        assert kernels[name].signature == [
            a.__class__(**{**a.__dict__, "sample": None}) for a in OPS[name].signature(CFG)
        ], f"{name}: manifest signature"
        check_kernel_against_reference(OPS[name], CFG, kernels[name], rng)


@pytest.fixture
def sigmoid_build(tmp_path) -> Path:
    """A build folder holding only `sigmoid_gate` (hand schedule)."""
    return build(CFG, llvm(), tmp_path / "logs", tmp_path, allow_hand=True, names=["sigmoid_gate"], echo=quiet).parent


@pytest.mark.parametrize(
    "field, value, changes",
    [
        ("batch", 2, {"batch": 2, "slots": 2}),
        ("max_len", 128, {"max_len": 128}),
        ("name", "qwen3.5-4b", {"name": "qwen3.5-4b"}),
        ("head_mapping", "tiled", {"head_mapping": "tiled"}),
        ("weight_dtype", "bfloat16", {"weight_dtype": "bfloat16"}),
        ("kv_dtype", "bfloat16", {"kv_dtype": "bfloat16"}),
        ("state_dtype", "bfloat16", {"state_dtype": "bfloat16"}),
        ("target", "cuda", {}),
    ],
)
def test_manifest_mismatch_is_an_error(sigmoid_build, field, value, changes):
    cfg, target = CFG.replace(**changes), value if field == "target" else "llvm"
    with pytest.raises(ManifestError, match=f"{field}=.* \\(wanted {value!r}\\)"):
        load(sigmoid_build, cfg, target)  # a build folder: its manifest is checked field by field
    with pytest.raises(ManifestError, match="no manifest.json"):
        load(sigmoid_build.parent, cfg, target)  # the build root: the folder for the request does not exist


def test_manifest_from_another_tvm_is_an_error(sigmoid_build):
    manifest = sigmoid_build / "manifest.json"
    manifest.write_text(manifest.read_text().replace(tvm.__version__, "0.0.0"))
    with pytest.raises(ManifestError, match="tvm='0.0.0'"):
        load(manifest, CFG, "llvm")


def test_interrupted_build_leaves_the_last_build(tmp_path, monkeypatch):
    """A build is written beside its folder and renamed into place at its end: one interrupted during the export
    leaves the last build whole; a temporary folder left by a killed build is ignored by `load` and removed by the
    next build of the name. (Checked without loading: a process that loaded a library gets that one again from the
    same path, even after a rebuild, since dlopen reuses it.)"""

    def built_ops() -> list[str]:
        """The ops of the build `load` would find under tmp_path, after checking its library."""
        file, manifest = read_manifest(tmp_path, CFG, "llvm")
        check_library(file, manifest)
        return sorted(manifest["functions"])

    path = build(CFG, llvm(), tmp_path / "logs", tmp_path, allow_hand=True, names=["sigmoid_gate"], echo=quiet)
    builds = path.parent.parent

    def interrupted(mod, target, library):
        library.write_bytes(b"\x7fELF, half written")
        raise KeyboardInterrupt

    monkeypatch.setattr(artifact, "export_library", interrupted)
    with pytest.raises(KeyboardInterrupt):
        build(CFG, llvm(), tmp_path / "logs", tmp_path, allow_hand=True, names=["kv_row_scatter"], echo=quiet)
    monkeypatch.undo()
    assert built_ops() == ["sigmoid_gate"] and [p.name for p in builds.iterdir()] == [path.parent.name]
    killed = shutil.copytree(path.parent, builds / f".{path.parent.name}.partial-killed")
    (killed / f"{path.parent.name}.so").write_bytes(b"")
    assert built_ops() == ["sigmoid_gate"]
    build(CFG, llvm(), tmp_path / "logs", tmp_path, allow_hand=True, names=["kv_row_scatter"], echo=quiet)
    assert built_ops() == ["kv_row_scatter"] and [p.name for p in builds.iterdir()] == [path.parent.name]


def test_missing_library_or_function_is_named(sigmoid_build):
    """(Truncated and altered libraries: tests/test_manifest_fuzz.py, in subprocesses.)"""
    manifest = json.loads((sigmoid_build / "manifest.json").read_text())
    library = sigmoid_build / manifest["library"]
    data = library.read_bytes()
    library.unlink()
    with pytest.raises(ManifestError, match=f"{re.escape(str(library))}: missing"):
        load(sigmoid_build, CFG, "llvm")
    library.write_bytes(data)
    functions = manifest["functions"]
    functions["gemv_k_proj"] = functions["sigmoid_gate"]
    manifest["digest"] = digest(manifest)  # as a build that lost a function would write it
    (sigmoid_build / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"lacks function\(s\) gemv_k_proj that"):
        load(sigmoid_build, CFG, "llvm")


def test_load_needs_only_the_tvm_runtime(sigmoid_build):
    code = (
        "import numpy as np, tvm.base\n"
        "from gdn_tvm.runtime.module import load\n"
        "from gdn_tvm.config import DecodeConfig, preset\n"
        f"cfg = DecodeConfig(preset({CFG.model.name!r}), batch={CFG.batch}, max_len={CFG.max_len}, **{F32!r})\n"
        f"k = load({str(sigmoid_build)!r}, cfg, 'llvm')['sigmoid_gate']\n"
        "x = np.ones(k.signature[0].shape, np.float32); y = np.zeros_like(x)\n"
        "k(x=x, gate=x, y=y)\n"
        "assert tvm.base._RUNTIME_ONLY and np.allclose(y, 1 / (1 + np.exp(-1.0)))\n"
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")  # libtvm_runtime only: the compiler is not even loaded
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@needs_cuda_export
def test_cuda_export_embeds_compiled_device_code(tmp_path):
    """A no-alias kernel, an in-place one and a slot pool's (streaming stores): three device modules, each function's
    extra ptxas flags in the manifest."""
    names = ["sigmoid_gate", "add_rmsnorm", "causal_conv1d_silu"]
    path = build(CFG, cuda(), tmp_path / "logs", tmp_path, allow_hand=True, names=names, echo=quiet)
    _, manifest = read_manifest(tmp_path, CFG, "cuda")
    assert manifest["cuda_compile"].split()[0] in ("nvcc", "nvrtc") and sorted(manifest["functions"]) == sorted(names)
    flags = {name: f["ptxas_flags"] for name, f in manifest["functions"].items()}
    assert flags == {"sigmoid_gate": [], "add_rmsnorm": [], "causal_conv1d_silu": ["--def-store-cache=cs"]}
    payload = (path.parent / manifest["library"]).read_bytes()
    assert b"__global__" not in payload, "the library embeds CUDA source"
    fatbins, elves = payload.count(b"\x50\xed\x55\xba"), payload.count(b"\x7fELF")  # nvcc fatbin, nvrtc cubin
    assert fatbins >= 2 or elves >= 3, "no compiled device code in the library"


@needs_cuda_export
@pytest.mark.skipif(gpu_present(), reason="a CUDA driver is present: tests/test_gpu.py decodes such a build")
def test_cuda_build_without_a_driver_is_named(tmp_path):
    """Runtime-only TVM registers no CUDA module loader: `load` loads the tvm package's `libtvm_runtime_cuda.so`
    for a CUDA build, and where that fails (no CUDA driver) the error says why."""
    build(CFG, cuda(), tmp_path / "logs", tmp_path, allow_hand=True, names=["sigmoid_gate"], echo=quiet)
    code = (
        "from gdn_tvm.config import DecodeConfig, preset\n"
        "from gdn_tvm.runtime.module import ManifestError, load\n"
        f"cfg = DecodeConfig(preset({CFG.model.name!r}), batch={CFG.batch}, max_len={CFG.max_len}, **{F32!r})\n"
        "try:\n"
        f"    load({str(tmp_path)!r}, cfg, 'cuda')\n"
        "except ManifestError as err:\n"
        "    print(err)\n"
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "a CUDA build, but TVM's CUDA runtime could not be loaded: libcuda.so.1" in done.stdout, done.stdout


BATCHED = CFG.replace(batch=LIBRARY_GEMM_LANES, slots=LIBRARY_GEMM_LANES, weight_dtype="bfloat16", kv_dtype="bfloat16")


@needs_cuda_export
def test_a_cuda_build_lists_library_gemms_as_cublas_calls(tmp_path):
    """A library GEMM is no function of a CUDA build: the manifest lists it as a cuBLAS call with its signature,
    under the digest (an edited `library` field is refused), and a build of library calls alone is refused."""
    names = ["split_bf16_hidden", "gemm_lm_head"]
    build(BATCHED, cuda(), tmp_path / "logs", tmp_path, allow_hand=True, names=names, echo=quiet)
    file, manifest = read_manifest(tmp_path, BATCHED, "cuda")
    gemm = manifest["functions"]["gemm_lm_head"]
    assert gemm["library"] == "cublas" and "library" not in manifest["functions"]["split_bf16_hidden"]
    assert [a["name"] for a in gemm["args"]] == ["w", "xs", "y"]
    edited = json.loads(file.read_text())
    edited["functions"]["gemm_lm_head"].pop("library")  # a cuBLAS call passed off as a function of the library
    file.write_text(json.dumps(edited))
    with pytest.raises(ManifestError, match="edited or corrupt"):
        read_manifest(tmp_path, BATCHED, "cuda")
    edited["functions"]["gemm_lm_head"]["library"] = "cutlass"
    edited["digest"] = digest(edited)
    file.write_text(json.dumps(edited))
    with pytest.raises(ManifestError, match=r"functions\.gemm_lm_head\.library: expected absent or one of"):
        read_manifest(tmp_path, BATCHED, "cuda")
    with pytest.raises(ValueError, match="nothing to compile for cuda: gemm_lm_head are library calls"):
        build(BATCHED, cuda(), tmp_path / "logs", tmp_path / "only", allow_hand=True, names=["gemm_lm_head"])


def test_library_gemms_are_kernels_on_llvm(tmp_path, rng):
    """On llvm the batched step's library GEMMs are TensorIR kernels like the rest: built, listed as functions and
    matching their references."""
    names = ["split_bf16_hidden", "gemm_in_proj_z", "swiglu"]
    build(BATCHED, llvm(), tmp_path / "logs", tmp_path, allow_hand=True, names=names, echo=quiet)
    _, manifest = read_manifest(tmp_path, BATCHED, "llvm")
    assert not any("library" in fn for fn in manifest["functions"].values())
    kernels = load(tmp_path, BATCHED, "llvm")
    for name in names:
        check_kernel_against_reference(OPS[name], BATCHED, kernels[name], rng)


def test_missing_cublas_is_named(tmp_path, monkeypatch):
    """A CUDA build's library GEMMs need cuBLAS: where it is not found, the error names what was tried."""
    bogus = tmp_path / "libcublas.so.13"
    bogus.write_text("not a library")
    monkeypatch.setenv("GDN_TVM_CUBLAS", str(bogus))
    monkeypatch.setenv("CUDA_PATH", str(tmp_path / "no-cuda"))
    monkeypatch.setattr(cublas, "NAMES", ())
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(cublas, "_LIBRARY", [])
    with pytest.raises(cublas.CublasError, match=f"set GDN_TVM_CUBLAS to the file; tried {re.escape(str(bogus))}"):
        cublas.library()


def test_dlight_ops_leave_out_what_no_rule_schedules():
    """The benchmarks' prebuilt dlight baseline: every op a dlight rule fits, marked "dlight"; attention and its
    prologue, RoPE, sampling (no rule fits, or the fit leaves loops on the host) are left out rather than built
    unscheduled."""
    scheduled = dlight_ops(CFG, cuda(), list(OPS))
    names = {s.name for s in scheduled}
    assert {s.source for s in scheduled} == {"dlight"}
    refused = ("decode_attention", "partial_neox_rope", "attention_prologue", "sample", "argmax")
    assert names == {n for n in OPS if not n.startswith(refused)}
    assert all(s.func.attrs["tirx.is_scheduled"] for s in scheduled)


@pytest.mark.skipif(tvm.runtime.enabled("cuda"), reason="TVM's CUDA runtime is loaded: device code compiles")
def test_cuda_export_without_a_driver_refuses_source_only(tmp_path):
    """In-process on a machine without libcuda.so.1, TVM keeps CUDA source: exporting that is an error."""
    mod = tvm.IRModule({"sigmoid_gate": OPS["sigmoid_gate"].schedule(CFG, "cuda").mod["main"]})
    with pytest.raises(RuntimeError, match="source, not compiled device code"):
        export_library(mod, cuda(), tmp_path / "ops.so")


@pytest.mark.parametrize("case", [*COMMITTED_BF16_STEP_LOGS, *COMMITTED_BF16_WIDE_STEP_LOGS])
def test_default_bf16_step_has_committed_h200_logs(case, tmp_path):
    """`make tune` / `make build` at their defaults (bf16 weights and KV, the mixer step's ops): every op has a record,
    so a strict build of the default shape needs no hand schedule."""
    cfg = (COMMITTED_BF16_STEP_LOGS | COMMITTED_BF16_WIDE_STEP_LOGS)[case]
    assert (cfg.weight_dtype, cfg.kv_dtype, cfg.state_dtype) == ("bfloat16", "bfloat16", "float32")
    scheduled = schedule_ops(cfg, "cuda", REPO / "tuning_logs", step_ops(cfg), allow_hand=False)
    assert {s.source for s in scheduled} == {"tuned"}


@pytest.mark.parametrize("case", list(COMMITTED_CUDA_LOGS))
def test_committed_h200_logs_build_strictly(case, tmp_path):
    """Every op of the shape has a record whose trace replays on its definition (no hand fallback); where a CUDA
    export compiles, the strict build compiles and exports too, with the compiler that timed every record (the
    pinned NVRTC: a new pin needs new logs)."""
    cfg = COMMITTED_CUDA_LOGS[case]
    scheduled = schedule_ops(cfg, "cuda", REPO / "tuning_logs", TUNED, allow_hand=False)
    assert {s.source for s in scheduled} == {"tuned"}
    if can_export_cuda():
        lines: list[str] = []
        manifest = json.loads(
            build(cfg, cuda(), REPO / "tuning_logs", tmp_path, names=TUNED, echo=lines.append).read_text()
        )
        functions = manifest["functions"]
        assert sorted(functions) == sorted(TUNED) and {f["schedule"] for f in functions.values()} == {"tuned"}
        assert {f["tuned_with"] for f in functions.values()} == {manifest["cuda_compile"]}
        assert not any(line.startswith("warning") for line in lines), lines


def copied_summary(cfg: DecodeConfig, op: str, logs: Path) -> Path:
    """`op`'s committed H200 log at `cfg` copied under `logs`; the copy's summary.json."""
    (w,) = [w for w, _ in workloads(cfg, "cuda", [op])]
    shutil.copytree(REPO / "tuning_logs" / w.key, logs / w.key)
    return logs / w.key / "summary.json"


def test_a_log_without_summary_builds_with_its_compiler_unknown(tmp_path):
    """The summary is the record's context, not the record: a log copied without it still applies."""
    cfg = COMMITTED_CUDA_LOGS["0.8b-B1"]
    summary = copied_summary(cfg, "sigmoid_gate", tmp_path)
    summary.unlink()
    (scheduled,) = schedule_ops(cfg, "cuda", tmp_path, ["sigmoid_gate"], allow_hand=False)
    assert scheduled.source == "tuned" and scheduled.tuned_with is None
    summary.write_text("{not json")
    with pytest.raises(TuningLogError, match="summary.json: unreadable"):
        schedule_ops(cfg, "cuda", tmp_path, ["sigmoid_gate"], allow_hand=False)


@needs_cuda_export
def test_build_names_records_tuned_with_another_compiler(tmp_path):
    """A record timed with another CUDA compiler still builds, and the build says which ops to re-tune."""
    cfg = COMMITTED_CUDA_LOGS["0.8b-B1"]
    logs = tmp_path / "logs"
    summary = copied_summary(cfg, "sigmoid_gate", logs)
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "compiler": "nvrtc 12.8"}))
    lines: list[str] = []
    manifest = json.loads(build(cfg, cuda(), logs, tmp_path, names=["sigmoid_gate"], echo=lines.append).read_text())
    assert manifest["functions"]["sigmoid_gate"]["tuned_with"] == "nvrtc 12.8"
    assert (
        lines[-1].startswith("warning: 1 op(s) were tuned with another compiler")
        and "sigmoid_gate (nvrtc 12.8)" in lines[-1]
    )


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU")
@pytest.mark.parametrize("case", list(COMMITTED_CUDA_LOGS))
def test_committed_h200_logs_build_and_match_reference(case, tmp_path, rng):
    """`make build` of the committed CUDA logs, strict; every op against its reference on the GPU."""
    cfg = COMMITTED_CUDA_LOGS[case]
    build(cfg, cuda(), REPO / "tuning_logs", tmp_path, names=TUNED, echo=quiet)
    kernels = load(tmp_path, cfg, "cuda")
    assert sorted(kernels) == sorted(TUNED)
    for name, kernel in kernels.items():
        check_kernel_against_reference(OPS[name], cfg, kernel, rng)


def test_whole_preset_stack_from_loaded_module(tmp_path, rng):
    """qwen3.5-0.8b's whole mixer stack (24 layers) on llvm kernels exported and loaded back (every preset runs on
    the GPU: tests/test_gpu.py; the larger ones would take 5-27 GiB of weights here)."""
    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=2, slots=3, max_len=256, split_len=64, **F32)
    build(cfg, llvm(), tmp_path / "no-logs", tmp_path, allow_hand=True, names=step_ops(cfg), echo=quiet)
    assert_preset_stack_decodes(cfg, load(tmp_path, cfg, "llvm"), tvm.cpu(), rng, graph=False)


def test_stack_steps_from_loaded_module_match_reference(tmp_path, rng):
    """The executor on kernels loaded from an exported module: 8 steps of a GDN + attention stack vs the reference;
    kernels built for another shape are refused when the launch plan is built."""
    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=48, split_len=16, **F32)
    build(cfg, llvm(), tmp_path / "logs", tmp_path / "build", allow_hand=True, names=step_ops(cfg), echo=quiet)
    kernels = load(tmp_path / "build", cfg, "llvm")
    stack = HybridStack(cfg, kernels, tvm.cpu(), layer_types=("gdn", "attention"), seed=3)
    assert_decodes_like_reference(stack, rng, steps=8)
    with pytest.raises(ArgumentError, match="k_cache: expected shape"):
        HybridStack(cfg.replace(max_len=64), kernels, tvm.cpu(), layer_types=("attention",))
    code = (  # the executor itself with the TVM runtime library alone
        "import numpy as np, tvm, tvm.base\n"
        "from gdn_tvm.config import DecodeConfig, preset\n"
        "from gdn_tvm.runtime.module import load\n"
        "from gdn_tvm.runtime.stack import HybridStack\n"
        f"cfg = DecodeConfig(preset({cfg.model.name!r}), batch=1, max_len=48, split_len=16, **{F32!r})\n"
        f"kernels = load({str(tmp_path / 'build')!r}, cfg, 'llvm')\n"
        "stack = HybridStack(cfg, kernels, tvm.cpu(), layer_types=('gdn', 'attention'))\n"
        "out = stack.step(np.ones((1, cfg.model.hidden), np.float32), [0], [stack.acquire()]).numpy()\n"
        "assert tvm.base._RUNTIME_ONLY and np.isfinite(out).all()\n"
    )
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
