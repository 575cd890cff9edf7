"""GPU tests (marker `gpu`; skipped without a CUDA device): every op against its reference on the H200 at real
preset shapes, large RoPE positions, 64 decode steps of the layers and a stack, graph-vs-eager identity, and every
preset's whole mixer stack from exported modules."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import tvm
from conftest import F32, assert_close, check_kernel_against_reference, check_op_against_reference, reads_dtype
from test_layers import STEPS, ReferenceStack, assert_preset_stack_decodes, lanes

from gdn_tvm.codegen.compile import build_kernels, compile_op
from gdn_tvm.config import PRESETS, DecodeConfig, preset
from gdn_tvm.export.artifact import build
from gdn_tvm.plan import LIBRARY_GEMM_LANES, LIBRARY_GEMM_MIN_LANES, step_ops
from gdn_tvm.plan import model as model_plan
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.model import Model, Request
from gdn_tvm.runtime.module import load
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.runtime.weights import random_model_weights
from gdn_tvm.target import cuda, device_of, gpu_present, llvm, memory_bytes
from gdn_tvm.verify import tolerance

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU")]

GPU_CASES = {
    "0.8b-B1": DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=4096, **F32),
    "4b-B1": DecodeConfig(preset("qwen3.5-4b"), batch=1, max_len=32768, **F32),
    "4b-B8-tiled": DecodeConfig(preset("qwen3.5-4b"), batch=8, slots=12, max_len=2048, **F32).replace(
        head_mapping="tiled"
    ),
    "27b-B4": DecodeConfig(preset("qwen3.5-27b"), batch=4, slots=6, max_len=1024, split_len=256, **F32),
    "next80b-B32": DecodeConfig(preset("qwen3-next-80b-a3b"), batch=32, slots=40, max_len=1024, split_len=256, **F32),
}
BF16_GPU_CASES = {  # weights, KV caches and recurrent states in bf16
    f"{name}-bf16": GPU_CASES[name].replace(weight_dtype="bfloat16", kv_dtype="bfloat16", state_dtype="bfloat16")
    for name in ("0.8b-B1", "4b-B8-tiled")
}
ROPE_LONG = DecodeConfig(preset("qwen3.5-4b"), batch=4, max_len=2**18 + 1, **F32)
WIDE_B = DecodeConfig(preset("qwen3.5-4b"), batch=256, max_len=1024, **F32)  # defaults that switch at large B


@pytest.mark.parametrize(
    ("name", "case"), [(n, c) for c, cfg in GPU_CASES.items() for n, op in OPS.items() if op.applies(cfg)]
)
def test_op_on_gpu(name, case, rng):
    check_op_against_reference(OPS[name], GPU_CASES[case], cuda(), rng)


@pytest.mark.parametrize("case", BF16_GPU_CASES)
@pytest.mark.parametrize("name", [n for n, op in OPS.items() if reads_dtype(op, GPU_CASES["0.8b-B1"])])
def test_bf16_op_on_gpu(name, case, rng):
    """The ops that read a storage dtype, at bf16 weights, KV caches and states."""
    check_op_against_reference(OPS[name], BF16_GPU_CASES[case], cuda(), rng)


def test_memory_bytes_of_the_gpu():
    """What `generate` compares a step's buffers with: the GPU's global memory (an H200 holds ~141 GB)."""
    assert memory_bytes(tvm.cuda(0)) > 2**30


def test_rope_large_positions_on_gpu(rng):
    check_op_against_reference(OPS["partial_neox_rope"], ROPE_LONG, cuda(), rng)


@pytest.mark.parametrize("name", ["partial_neox_rope", "decode_attention_reduce", "delta_rule", "delta_rule_fused"])
def test_large_batch_defaults_on_gpu(name, rng):
    """RoPE's shared angles (from `MANY_HEADS_PER_SM` warps an SM), the one-group reduce (one resident wave) and the
    delta rule's one-warp CTAs storing their rows last (from `MANY_ROWS` state rows, the fused op's from
    `FUSED_ONE_WARP`) at B=256."""
    check_op_against_reference(OPS[name], WIDE_B, cuda(), rng)


LAYER_GPU = {
    "0.8b-B1": GPU_CASES["0.8b-B1"],
    "4b-B8": DecodeConfig(preset("qwen3.5-4b"), batch=8, slots=12, max_len=1024, **F32),
    "0.8b-B1-bf16": GPU_CASES["0.8b-B1"].replace(weight_dtype="bfloat16", kv_dtype="bfloat16"),  # float32 states
}
_KERNELS: dict[str, dict] = {}


def gpu_stack(case: str, types: tuple[str, ...], seed: int) -> HybridStack:
    cfg = LAYER_GPU[case]
    if case not in _KERNELS:
        _KERNELS[case] = build_kernels(cfg, cuda(), step_ops(cfg))
    return HybridStack(cfg, _KERNELS[case], device_of(cuda()), layer_types=types, seed=seed)


@pytest.mark.parametrize("case", LAYER_GPU)
@pytest.mark.parametrize("types", [("gdn",), ("attention",), ("gdn", "gdn", "gdn", "attention")], ids="-".join)
def test_decode_steps_on_gpu_graph_equals_eager(case, types, rng):
    """Eager and graph-replayed stacks with the same weights step side by side: bit-identical to each other,
    within the layer tolerance of the float64 reference (1e-3 in float32) after 64 steps with states carried."""
    seed = int(rng.integers(2**31))
    eager, graphed = gpu_stack(case, types, seed), gpu_stack(case, types, seed)
    graphed.capture()
    ref = ReferenceStack(eager)
    cfg = eager.cfg
    tol = tolerance((cfg.weight_dtype, cfg.kv_dtype, cfg.state_dtype), layer=True)
    slots, start = lanes(cfg, rng)
    active = slots >= 0
    for t in range(STEPS):
        x = rng.standard_normal((cfg.batch, cfg.model.hidden)).astype(np.float32)
        x[~active] = 0.0
        out_e = eager.step(x, start + t, slots).numpy()
        out_g = graphed.step_graph(x, start + t, slots).numpy()
        assert np.array_equal(out_e[active], out_g[active]), f"step {t}: graph replay differs from eager"
        assert_close(out_e[active], ref.step(x.astype(np.float64), start + t, slots)[active], tol, f"step {t}")
    for le, lg in zip(eager.layers, graphed.layers, strict=True):
        for se, sg in zip(le.states, lg.states, strict=True):
            assert np.array_equal(se.numpy(), sg.numpy())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_stack_from_exported_modules(name, tmp_path, rng):
    """Each preset's kernels exported as `make build` does and loaded back; its whole stack replayed as a graph."""
    cfg = DecodeConfig(preset(name), batch=2, slots=3, max_len=256, split_len=64, **F32)
    build(cfg, cuda(), tmp_path / "no-logs", tmp_path, allow_hand=True, names=step_ops(cfg), echo=lambda _: None)
    assert_preset_stack_decodes(cfg, load(tmp_path, cfg, "cuda"), device_of(cuda()), rng, graph=True)


RUNTIME_ONLY_STEP = """
import sys
import numpy as np, tvm
from gdn_tvm.config import DecodeConfig, preset
from gdn_tvm.runtime.module import load
from gdn_tvm.runtime.stack import HybridStack
cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=256, split_len=64, weight_dtype="float32",
                 kv_dtype="float32")
stack = HybridStack(cfg, load(sys.argv[1], cfg, "cuda"), tvm.cuda(0), seed=3)
stack.capture()
x = np.load(sys.argv[2])
for t in range(4):
    out = stack.step_graph(x[t], [t], [0]).numpy()
np.save(sys.argv[3], out)
maps = open("/proc/self/maps").read()
print("compiler loaded:", "libtvm_compiler" in maps, "| torch loaded:", "torch" in sys.modules)
"""


def test_runtime_only_process_decodes_a_cuda_build(tmp_path, rng):
    """A CUDA build loaded where the TVM compiler never is (TVM_USE_RUNTIME_LIB=1, as a deployment without the
    compiler): `load` registers the CUDA module loader itself, and 4 graph-replayed steps equal the same steps of a
    stack built in this process."""
    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=1, max_len=256, split_len=64, **F32)
    build(cfg, cuda(), tmp_path / "no-logs", tmp_path, allow_hand=True, names=step_ops(cfg), echo=lambda _: None)
    x = rng.standard_normal((4, 1, cfg.model.hidden)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    done = subprocess.run(
        [sys.executable, "-c", RUNTIME_ONLY_STEP, str(tmp_path), str(tmp_path / "x.npy"), str(tmp_path / "out.npy")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compiler loaded: False" in done.stdout, done.stdout
    stack = HybridStack(cfg, load(tmp_path, cfg, "cuda"), device_of(cuda()), seed=3)
    for t in range(4):
        out = stack.step(x[t], [t], [0]).numpy()
    assert np.array_equal(np.load(tmp_path / "out.npy"), out)


@pytest.mark.parametrize("label", ["fla", "fla_kfirst", "fla_inplace"])
@pytest.mark.parametrize("name", ["delta_rule", "delta_rule_fused"])
def test_fla_baseline_computes_the_op(name, label, rng):
    """Each of the benchmark's fla baselines (keyword call in either state layout, the kernel in place) against the
    float64 reference, at a batch where fla's K-first and V-first kernels both run; the benchmark checks it again
    before timing it."""
    pytest.importorskip("fla", reason="fla-core (flash-linear-attention) is the delta rule's benchmark baseline")
    from benchmarks import fla_ops, run

    op, cfg = OPS[name], DecodeConfig(preset("qwen3.5-4b"), batch=8, **F32)
    values = run.inputs(op, cfg, rng)
    v_first, in_place = fla_ops.LAYOUTS[label]
    mine = run.clone(values)
    step = fla_ops.FlaStep(cfg, mine, fused=bool(op.flags.get("fused")), v_first=v_first, in_place=in_place)
    step()
    outputs = step.outputs()
    err, why = run.check(op, cfg, outputs, run.expected(op, cfg, values))
    assert why is None, f"{name} {label}: {why}"
    assert (outputs["state"].data_ptr() == mine["state"].data_ptr()) == in_place, "in place means our own buffer"
    assert err > 0, "fla's float32 result is not bit-identical to a float64 reference: the check read something else"


@pytest.mark.parametrize(
    "name", ["gemv_o_proj", "gemv_out_proj_norm", "decode_attention", "delta_rule", "kv_row_scatter"]
)
def test_bf16_op_benchmark_row(name, rng):
    """The op benchmark at bf16 storage (bf16 torch inputs, PyTorch's matmuls on bf16 activations): our kernel and
    the PyTorch baseline pass their checks and are timed; the row names the bf16 workload."""
    from benchmarks import run
    from benchmarks.configs import op_config

    cfg = op_config("qwen3.5-0.8b", 8, weight_dtype="bfloat16", kv_dtype="bfloat16", state_dtype="bfloat16")
    row = run.bench_op(OPS[name], cfg, compile_op(OPS[name], cfg, cuda()), rng)
    assert "tvm_error" not in row and "torch_error" not in row, row
    assert row["tvm_us"] > 0 and row["torch_us"] > 0 and "bf16" in row["key"], row


@pytest.mark.parametrize("name", [name for name, op in OPS.items() if op.library])
def test_library_gemm_on_gpu(name, tmp_path, rng):
    """Each library GEMM of a CUDA build (cuBLAS through `runtime.cublas`, loaded from the build's manifest) at
    qwen3.5-4b B=32 against its reference: the product of x's two bf16 rows, within the op tolerance."""
    cfg = DecodeConfig(preset("qwen3.5-4b"), batch=32, max_len=1024)
    build(cfg, cuda(), tmp_path / "logs", tmp_path, allow_hand=True, names=["split_bf16_hidden", name], echo=print)
    check_kernel_against_reference(OPS[name], cfg, load(tmp_path, cfg, "cuda")[name], rng)


MODEL_GPU = DecodeConfig(preset("qwen3.5-0.8b"), batch=3, slots=5, max_len=160, split_len=32, **F32).replace(
    n_layers=4, vocab_size=4099
)  # three GDN layers and an attention one at 0.8b sizes, every model op at its CUDA schedule


@pytest.mark.parametrize("batch", [3, 1, LIBRARY_GEMM_MIN_LANES, LIBRARY_GEMM_LANES])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_model_on_gpu_matches_llvm_and_replays_as_eager(dtype, batch, rng):
    """Three requests (greedy and sampled, different prompt lengths and budgets, on slots 4, 0, 2; B = 1: the first,
    on slot 4, through the plan with `fusions.block_stages`; at bf16 B = 16: the projections as cuBLAS GEMMs, B = 4: the
    larger ones, qkv, gate|up, q and the LM head) decoded by the CUDA model eagerly and replayed, and by the llvm model
    (checked against transformers in CI): replay bit-identical to eager on the started lanes, the same tokens as llvm,
    logits within the op tolerance of llvm's at every step."""
    cfg = MODEL_GPU.replace(weight_dtype=dtype, kv_dtype=dtype, batch=batch, slots=max(batch, MODEL_GPU.slots))
    weights = random_model_weights(cfg.model, rng)
    ops = model_plan(cfg).ops
    gpu_kernels = build_kernels(cfg, cuda(), ops)
    models = [Model(cfg, build_kernels(cfg, llvm(), ops), tvm.cpu(), weights)]
    models += [Model(cfg, gpu_kernels, device_of(cuda()), weights) for _ in range(2)]
    models[2].capture()
    V = cfg.model.vocab_size
    requests = [
        Request(rng.integers(0, V, 7).tolist(), 60),
        Request(rng.integers(0, V, 2).tolist(), 25, temperature=0.7, top_k=40, top_p=0.9, seed=7),
        Request(rng.integers(0, V, 1).tolist(), 90),
    ]
    for model in models:
        for request, slot in zip(requests[:batch], (4, 0, 2), strict=False):
            model.start(request, slot=slot)
    tol = tolerance((dtype,))
    for step in range(100):
        events = [model.events(model.launch()) for model in models]
        logits = [model.logits.numpy() for model in models]
        # A lane never started is skipped (slot -1): its mixers leave their outputs as each model's fresh buffers
        # held, so its logits are of no request; the started lanes' must agree.
        live = slice(len(requests[:batch]))
        assert np.array_equal(events[1], events[2]), f"step {step}: replay's events differ from eager"
        assert np.array_equal(logits[1][live], logits[2][live]), f"step {step}: replay's logits differ from eager"
        assert np.array_equal(events[0], events[1]), f"step {step}: tokens differ from llvm"
        assert_close(logits[1][live], logits[0][live], tol, f"step {step} logits")
    assert all(not model._lane_slot for model in models), "every request finished"
