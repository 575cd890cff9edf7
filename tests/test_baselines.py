"""The benchmarks' PyTorch baselines compute the same ops and steps as the kernels (on the CPU), and the byte
counts the GB/s figures use follow the ops' traffic."""

from __future__ import annotations

import json
import lzma

import numpy as np
import pytest
import torch
import tvm
from conftest import CASES, F32, assert_close

from benchmarks import fla_ops, profile, report, run, steps, swap, sweep, timing, torch_ops
from benchmarks.record import portable_arg
from benchmarks.run import input_sets, inputs
from benchmarks.steps import TorchStack, state_bytes
from gdn_tvm.codegen.compile import build_kernels, compile_op
from gdn_tvm.plan import step_ops
from gdn_tvm.registry import OPS
from gdn_tvm.runtime.stack import HybridStack
from gdn_tvm.signature import visible
from gdn_tvm.target import DEFAULT_GPU, llvm
from gdn_tvm.traffic import LAUNCHES, rotating_sets, traffic
from gdn_tvm.verify import TOL_LAYER, TOL_OP, reference_copy

CFG = CASES["4b-B3"].replace(slots=3)  # the benchmark's layout: every lane active, slots 0..B-1
BF16 = CFG.replace(weight_dtype="bfloat16", kv_dtype="bfloat16", state_dtype="bfloat16")
TWINNED = [n for n, op in OPS.items() if torch_ops.baseline(op) is not None]


@pytest.mark.parametrize("name", TWINNED)
def test_torch_baseline_matches_reference(name, rng):
    op = OPS[name]
    values = inputs(op, CFG, rng, device="cpu")
    expect = reference_copy({k: v.numpy() for k, v in values.items()})
    op.run_reference(CFG, expect)
    torch_ops.baseline(op)(CFG.model, seq_len=CFG.max_len, **values)
    for a in visible(op.signature(CFG)):
        if a.role in ("out", "state"):
            assert_close(values[a.name].numpy(), expect[a.name], 0 if op.exact else TOL_OP, f"{name}.{a.name}")


@pytest.mark.parametrize("name", TWINNED)
def test_bf16_torch_baseline_passes_the_benchmark_check(name, rng):
    """At bf16 storage the benchmark's PyTorch step (its GEMVs and attention on bf16 activations, as engines run
    them; the rest in float32 on widened weights, states stored rounded) passes the check it gets before timing:
    the per-op tolerance, or the stated bf16-activation one for exactly those matmuls."""
    op = OPS[name]
    values = inputs(op, BF16, rng, device="cpu")
    step = run.TorchStep(op, BF16, run.clone(values))
    step()
    _, why = run.check(op, BF16, step.outputs(), run.expected(op, BF16, values), step.tolerance)
    assert why is None, why
    matmul = op.family in ("gemv", "decode_attention")
    assert step.tolerance == (torch_ops.BF16_ACTIVATIONS_TOL if matmul else None)
    assert torch_ops.activation_dtype(op, CFG) == torch.float32  # float32 storage: float32 activations


def test_bf16_inputs_hold_the_sampled_bf16_values(rng):
    """Arguments stored in bf16 reach torch as bfloat16 tensors (through a uint16 view), the others as before; the
    reference reads the same values back."""
    op = OPS["gemv_out_proj_norm"]
    values = inputs(op, BF16, rng, device="cpu")
    for a in visible(op.signature(BF16)):
        assert str(values[a.name].dtype) == f"torch.{a.dtype}", a.name
    w = values["w"]
    assert torch.equal(run.to_torch(run.to_numpy(w)), w)
    assert np.array_equal(reference_copy({"w": run.to_numpy(w)})["w"], w.double().numpy())


@pytest.mark.parametrize("name", ["delta_rule", "kv_row_scatter", "gemv_out_proj_norm", "per_head_rmsnorm"])
def test_bf16_kernel_passes_the_benchmark_check_on_torch_tensors(name, rng):
    """Our kernel (llvm here) on the benchmark's bf16 torch inputs, checked as the benchmark checks it: the op's own
    tolerance (a bf16 state within one bf16 ulp of the reference, the KV scatter bit for bit)."""
    op = OPS[name]
    values = inputs(op, BF16, rng, device="cpu")
    expect = run.expected(op, BF16, values)
    compile_op(op, BF16, llvm()).launch(values)
    _, why = run.check(op, BF16, values, expect)
    assert why is None, why


def test_report_names_the_dtypes_of_a_bf16_run():
    """A bf16 run's table says so and how its PyTorch matmuls ran; a float32 run's reads as before."""
    row = {"op": "gemv_o_proj", "batch": 1, "tvm_us": 1.0, "tvm_gbps": 1.0, "tvm_pct_peak": 1.0}
    data = {"preset": "qwen3.5-4b", "gpu": "H200", "commit": "c", "command": "x", "empty_launch_us": 1.0,
            "peak_gbps": 4300.0, "rows": [row]}  # fmt: skip
    f32 = report.ops_table(data)
    assert report.ops_table(data | {"dtypes": dict.fromkeys(("weight_dtype", "kv_dtype"), "float32")}) == f32
    bf16 = report.ops_table(data | {"dtypes": {"weight_dtype": "bfloat16", "kv_dtype": "float32"}})
    assert bf16[0] == f32[0].replace("qwen3.5-4b", "qwen3.5-4b, weight bfloat16, kv float32")
    assert "bf16 activations" in " ".join(bf16) and "bf16 activations" not in " ".join(f32)


@pytest.mark.parametrize("name", ["delta_rule_fused", "gemv_out_proj", "kv_row_scatter"])
def test_benchmark_checks_a_baseline_against_the_reference_before_timing_it(name, rng):
    """The benchmark's check passes the PyTorch baseline and names the output of one that computes something else
    (a perturbed output: what a misplaced positional argument gives)."""
    op = OPS[name]
    values = inputs(op, CFG, rng, device="cpu")
    expect = run.expected(op, CFG, values)
    step = run.TorchStep(op, CFG, run.clone(values))
    step()
    err, why = run.check(op, CFG, step.outputs(), expect)
    assert why is None and err <= (0 if op.exact else TOL_OP)
    outputs = step.outputs()
    name_out = next(iter(expect))
    outputs[name_out] = outputs[name_out].clone()
    outputs[name_out].view(-1)[rng.integers(outputs[name_out].numel())] += 1.0
    err, why = run.check(op, CFG, outputs, expect)
    assert why is not None and why.startswith(f"{name_out}: ") and err > 0


def test_split_attention_stages_have_no_torch_column():
    """Their PyTorch counterpart is the whole attention, timed and checked in decode_attention's row."""
    assert torch_ops.baseline(OPS["decode_attention"]) is not None
    assert all(torch_ops.baseline(OPS[n]) is None for n in ("decode_attention_split", "decode_attention_reduce"))
    assert set(run.baselines(OPS["delta_rule"])) == {"torch", *fla_ops.LAYOUTS}


def test_input_sets_are_distinct_buffers_of_one_sample(rng):
    """The rotating sets must not share memory (or a graph's launches would hit in L2) but may share values."""
    sets = input_sets(OPS["kv_row_scatter"], CFG, rng, 3, device="cpu")
    for name, value in sets[0].items():
        assert len({s[name].data_ptr() for s in sets}) == 3, name
        assert all(torch.equal(s[name], value) for s in sets[1:]), name


def test_rotating_sets_cover_three_l2s_within_one_graph():
    assert rotating_sets(1) == LAUNCHES  # small ops: as many sets as launches
    assert rotating_sets(DEFAULT_GPU.l2_bytes) == 3
    assert rotating_sets(3 * DEFAULT_GPU.l2_bytes) == rotating_sets(2**40) == 1


def test_traffic_counts_touched_state_and_kv_rows():
    m, B, L = CFG.model, CFG.batch, CFG.max_len
    sig = {a.name: a for a in OPS["delta_rule"].signature(CFG)}
    once = sum(sig[n].nbytes for n in ("qk", "qkv", "g", "beta", "slots", "o"))
    assert traffic(OPS["delta_rule"], CFG) == once + 2 * sig["state"].nbytes  # every slot touched: read + write
    sig = {a.name: a for a in OPS["decode_attention_split"].signature(CFG)}
    once = sum(sig[n].nbytes for n in ("q", "slots", "positions", "m", "l", "acc"))
    kv_rows = B * L * m.n_kv_heads * m.head_dim * 4  # every position of every lane, k and v
    assert traffic(OPS["decode_attention_split"], CFG) == once + 2 * kv_rows
    bf16 = CFG.replace(kv_dtype="bfloat16")  # KV rows counted in the cache's dtype
    assert traffic(OPS["decode_attention_split"], bf16) == once + kv_rows
    scatter = [a for a in OPS["kv_row_scatter"].signature(bf16) if a.alias is None]
    rest = sum(a.nbytes for a in scatter if "cache" not in a.name)
    assert traffic(OPS["kv_row_scatter"], bf16) == rest + 2 * B * m.n_kv_heads * m.head_dim * 2  # one row a lane


def test_traffic_counts_the_embedding_rows_read_and_the_swiglu_product():
    m, B = CFG.model, CFG.batch
    sig = {a.name: a for a in OPS["embedding"].signature(CFG)}
    assert traffic(OPS["embedding"], CFG) == sig["ids"].nbytes + 2 * B * m.hidden * 4  # B rows in, B rows out
    swiglu = OPS["gemv_gate_up_proj_swiglu"]
    w, x, y = swiglu.signature(CFG)
    assert (w.shape, y.shape) == ((2 * m.intermediate_size, m.hidden), (B, m.intermediate_size))
    assert traffic(swiglu, CFG) == w.nbytes + x.nbytes + y.nbytes


def test_step_state_bytes_count_gdn_states_twice_and_kv_rows_to_the_position():
    cfg = CASES["0.8b-B1"].replace(batch=2, slots=3)
    m = cfg.model
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=("gdn", "attention"))
    conv = m.conv_dim * (m.conv_kernel - 1) * 4
    recurrent = m.n_v_heads * m.head_k_dim * m.head_v_dim * 4
    kv_rows = 8 * m.n_kv_heads * m.head_dim * 4  # rows 0..7, k and v each
    assert state_bytes(stack, position=7) == cfg.batch * (2 * (conv + recurrent) + 2 * kv_rows)
    bf16 = cfg.replace(kv_dtype="bfloat16", state_dtype="bfloat16")  # each pool counted in its own dtype
    stack = HybridStack(bf16, build_kernels(bf16, llvm(), step_ops(bf16)), tvm.cpu(), layer_types=("gdn", "attention"))
    assert state_bytes(stack, position=7) == cfg.batch * (2 * (conv + recurrent // 2) + kv_rows)


def test_kernel_breakdown_times_every_launch_of_the_plan_by_name(monkeypatch):
    """(The graph is faked here: no GPU.) One row per launch, in plan order, each timing a graph of LAUNCHES calls
    of that launch."""
    cfg = CASES["0.8b-B1"]
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=("gdn", "attention"))
    stack.write_inputs(np.zeros((1, cfg.model.hidden), np.float32), [0], [-1])  # every lane skipped: no state change
    captured = []

    class FakeGraph:
        def __init__(self, run, launches):
            captured.append(len(run()))  # the capture runs the launch LAUNCHES times
            assert launches == LAUNCHES

        def replay(self):
            pass

        def elapsed(self, replays):
            return replays * len(captured) * LAUNCHES / 1e6  # graph n: n us a launch

    monkeypatch.setattr(timing, "CudaGraph", FakeGraph)
    rows = steps.kernel_breakdown(stack)
    assert [r["kernel"] for r in rows] == [n for layer in stack.layers for n in layer.launched]
    assert [r["us"] for r in rows] == list(range(1, len(rows) + 1)) and captured == [LAUNCHES] * len(rows)
    assert {"delta_rule_fused", "decode_attention_reduce"} <= {r["kernel"] for r in rows}


def test_torch_step_matches_the_executor(rng):
    cfg = CASES["0.8b-B1"]
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=("gdn", "attention"))
    ref = TorchStack(stack)
    slots = np.array([stack.acquire()], np.int32)
    for t in range(4):
        x = rng.standard_normal((1, cfg.model.hidden)).astype(np.float32)
        out = stack.step(x, [t], slots).numpy()
        expect = ref.step(torch.from_numpy(x), torch.tensor([t]), torch.from_numpy(slots), t + 1).numpy()
        assert_close(out, expect, TOL_LAYER, f"step {t}")


def test_recorded_commands_name_output_files_without_machine_paths():
    args = ["--batches", "32", "--out", "/some/machine/out/g1/h200_ops.json", "--library", "build/bench/hand"]
    assert [portable_arg(a) for a in args] == [
        "--batches",
        "32",
        "--out",
        "h200_ops.json",
        "--library",
        "build/bench/hand",
    ]


def test_profile_rejects_a_position_past_the_cache(capsys):
    """The ncu harness names a bad --position before it compiles or touches a GPU."""
    with pytest.raises(SystemExit):
        profile.main(["--op", "decode_attention_split", "--batch", "1", "--position", "32768"])
    assert "--position 32768 is outside the cache's 32768 rows" in capsys.readouterr().err


def test_sweep_out_of_place_binds_a_fresh_state_for_the_aliased_output(rng):
    """`--out-of-place` times the kernel writing its state elsewhere: every other argument as the kernel binds it."""
    op = OPS["delta_rule"]
    values = inputs(op, CFG, rng, device="cpu")
    signature = op.signature(CFG)
    args = sweep.bind_apart(signature, values)
    for a, arg in zip(signature, args, strict=True):
        if a.alias:
            state = values[a.alias]
            assert arg is not state and (arg.shape, arg.dtype) == (state.shape, state.dtype)
        else:
            assert arg is values[a.name]
    assert sum(1 for a in signature if a.alias) == 1


def test_sweep_records_a_design_that_fails_to_launch_and_goes_on(monkeypatch, rng):
    """A design the GPU refuses (here: every launch raises) is a row with its error, never timed; the sweep goes on
    to the next design instead of ending."""

    class Refused:
        def launch(self, values):
            raise RuntimeError("too many resources requested for launch")

    monkeypatch.setattr(sweep, "input_sets", lambda *a, **k: input_sets(*a, **k, device="cpu"))
    monkeypatch.setattr(sweep, "designs", lambda name, cfg, pool, combos: [({"rows": 1}, Refused()), ({}, Refused())])
    rows = sweep.sweep("sigmoid_gate", "qwen3.5-0.8b", 1, rng)
    assert [r["knobs"] for r in rows] == [{"rows": 1}, "defaults"]
    assert all(r["error"] == "failed: RuntimeError: too many resources requested for launch" for r in rows)
    assert not any("us" in r for r in rows)


@pytest.mark.parametrize("name", ["sweeps.jsonl", "sweeps.jsonl.xz"])
def test_sweep_appends_rows_to_plain_and_packed_files(tmp_path, name):
    """A second sweep's rows follow the first's: in an `.xz` file as a second stream, read whole."""
    path = tmp_path / name
    sweep.append_rows(str(path), [{"op": "a", "us": 1.0}])
    sweep.append_rows(str(path), [{"op": "b", "us": 2.0}, {"op": "c", "error": "refused"}])
    data = lzma.decompress(path.read_bytes()) if name.endswith(".xz") else path.read_bytes()
    assert [json.loads(line)["op"] for line in data.decode().splitlines()] == ["a", "b", "c"]


def test_sweep_rejects_a_position_past_the_cache(rng):
    """(Before anything compiles or touches a GPU.)"""
    with pytest.raises(ValueError, match="outside the cache"):
        sweep.sweep("decode_attention_split", "qwen3.5-4b", 1, rng, position=10**6, max_len=4096)


def test_swap_replaces_one_planned_argument_at_a_time():
    """The step-vs-benchmark harness: the planned launch, then each argument (an alias's write side with its
    state) taken from the benchmark's inputs, then all of them; every call runs."""
    cfg = CASES["4b-B3"]
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=("attention",))
    stack.write_inputs(np.zeros((3, cfg.model.hidden), np.float32), [5, 9, 70], [2, 0, 3])
    op = "decode_attention_split"
    bench = swap.benchmark_inputs(op, cfg, 40, device="cpu")
    calls = swap.swapped_calls(stack, op, bench)
    names = [a.alias or a.name for a in OPS[op].signature(cfg)]
    visible_names = [a.name for a in visible(OPS[op].signature(cfg))]
    assert [label for label, _, _ in calls] == [None, *visible_names, "all"]
    planned = calls[0][2]
    assert planned == stack.layers[0].launches[stack.layers[0].launched.index(op)][1]
    for label, _, call in calls[1:-1]:
        changed = [n for n, a, b in zip(names, call, planned, strict=True) if a is not b]
        assert changed and set(changed) == {label}, label
        assert all(a is bench[n] for n, a in zip(names, call, strict=True) if n == label)
    assert all(a is bench[n] for n, a in zip(names, calls[-1][2], strict=True))
    for _, func, call in calls:
        func(*call)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--op", "decode_attention", "--batch", "32"],
            "--op decode_attention is not launched by a cuda/qwen3.5-4b-B32",
        ),
        (["--op", "decode_attention_split", "--decode", "4096"], "--decode 4096 is outside the cache's 4096 rows"),
    ],
)
def test_swap_rejects_what_the_step_cannot_time(argv, message, capsys):
    """(Before anything compiles or touches a GPU.)"""
    with pytest.raises(SystemExit):
        swap.main(argv)
    assert message in capsys.readouterr().err


def test_results_name_the_compiler_of_their_kernels(tmp_path, monkeypatch):
    """A prebuilt build's compiler comes from its manifest; kernels compiled in process, from the pinned NVRTC."""
    monkeypatch.delenv("TVM_CUDA_COMPILE_MODE", raising=False)
    cfg = CASES["0.8b-B1"]
    assert run.build_compiler(None, cfg) == run.build_compiler(str(tmp_path), cfg) == "nvrtc 13.0"  # no build there
    monkeypatch.setattr(run, "read_manifest", lambda root, cfg, target: (None, {"cuda_compile": "nvcc 13.0"}))
    assert run.build_compiler("prebuilt", cfg) == "nvcc 13.0"


@pytest.mark.parametrize("fault", [None, "wrong", "raises", "capture fails", "vanished"])
def test_step_baseline_is_checked_before_it_is_timed(fault, monkeypatch, rng):
    """(No GPU: timing faked.) The step benchmark's PyTorch step is timed only where it matches our step from the
    same states and caches; a wrong one is recorded as wrong, one that raises as failed, one with nothing to compare
    (our output all zero) as unchecked, all untimed; a graph capture that fails keeps the eager time."""
    cfg = CASES["0.8b-B1"]
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=("gdn", "attention"))
    slots, positions = np.array([stack.acquire()], np.int32), np.zeros(1, np.int32)
    x = rng.standard_normal((1, cfg.model.hidden)).astype(np.float32) * (fault != "vanished")  # zero in, zero out
    stack.write_inputs(x, positions, slots)
    timed = []

    def fake_time(fn, sets):
        fn(0)
        timed.append(fn)
        return 7.0

    def failed_capture(fn, sets):
        raise RuntimeError("operation not permitted when stream is capturing")

    def step(self, *args):
        if fault == "raises":
            raise RuntimeError("boom")
        return -real_step(self, *args)

    real_step = TorchStack.step
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self: self)
    monkeypatch.setattr(steps, "time_eager", fake_time)
    monkeypatch.setattr(steps, "time_graph", failed_capture if fault == "capture fails" else fake_time)
    if fault in ("wrong", "raises"):
        monkeypatch.setattr(TorchStack, "step", step)
    row = steps.bench_torch(stack, x, positions, slots, 1)
    if fault is None:
        assert row["torch_rel_err"] <= TOL_LAYER and row["torch_eager_us"] == row["torch_graph_us"] == 7.0
    elif fault == "capture fails":
        assert row["torch_eager_us"] == 7.0 and row["torch_graph_error"].startswith("failed: RuntimeError: operation")
    else:
        assert list(row) == ["torch_error"] and not timed
        expected = {"wrong": "wrong: 2.00e+00", "raises": "failed: RuntimeError: boom", "vanished": "unchecked: our"}
        assert row["torch_error"].startswith(expected[fault])


def test_decode_until_decodes_every_position_before_and_writes_the_next(monkeypatch):
    """(Graph replay faked by eager steps: no GPU.) The benchmarks' timed step reads what decoding wrote."""
    cfg = CASES["4b-B3"]
    stack = HybridStack(cfg, build_kernels(cfg, llvm(), step_ops(cfg)), tvm.cpu(), layer_types=("attention",))
    decoded = []

    def step(x, positions, slots):
        decoded.append(positions.tolist())
        return stack.step(x, positions, slots)

    monkeypatch.setattr(stack, "step_graph", step)
    x, slots = steps.decode_until(stack, 3)
    assert decoded == [[t] * 3 for t in range(3)] and slots.tolist() == [0, 1, 2]
    assert stack.io.positions.numpy().tolist() == [3, 3, 3] and np.array_equal(stack.x.numpy(), x)
    k_cache = stack.layers[0].tensors["k_cache"].numpy()
    assert np.abs(k_cache[:3, :3]).min(axis=(2, 3)).all()  # rows 0..2 of every slot written


def test_torch_model_matches_the_model(rng):
    """The whole-model baseline (float32 activations, its PyTorch recurrence in place of fla's) gives the model's
    logits step after step, lanes on slots 0..B-1 as it has them."""
    from benchmarks.torch_model import TorchModel
    from gdn_tvm.config import DecodeConfig, ModelConfig
    from gdn_tvm.plan import model as model_plan
    from gdn_tvm.runtime.model import Model, Request
    from gdn_tvm.runtime.weights import random_model_weights

    m = ModelConfig(
        "tiny", hidden=64, n_layers=4, n_q_heads=2, n_kv_heads=1, n_k_heads=2, n_v_heads=4, head_k_dim=16,
        head_v_dim=16, head_dim=32, vocab_size=320, intermediate_size=96, tie_word_embeddings=False,
    )  # fmt: skip
    cfg = DecodeConfig(m, batch=2, max_len=32, split_len=16, **F32)
    weights = random_model_weights(m, rng)
    ours = Model(cfg, build_kernels(cfg, llvm(), model_plan(cfg).ops), tvm.cpu(), weights)
    baseline = TorchModel(cfg, {k: torch.from_numpy(v) for k, v in weights.items()}, torch.float32, "torch")
    ids = rng.integers(0, m.vocab_size, (8, cfg.batch))
    for lane in range(cfg.batch):
        ours.start(Request([*ids[:, lane].tolist(), 0], 1))
    for t in range(len(ids)):
        ours.events(ours.launch())
        theirs = baseline.step(torch.from_numpy(ids[t]), t).numpy()
        assert_close(theirs, ours.logits.numpy(), TOL_OP, f"step {t}")


def test_model_floor_counts_weights_once_states_twice_and_kv_to_the_position():
    """The whole-model byte floor: every weight once in its stored dtype (a tied table once, though the embedding
    and the LM head both read it), recurrent and conv states read and written, KV rows 0..position read plus one."""
    from benchmarks.configs import model_config
    from benchmarks.model import floor_bytes
    from gdn_tvm.plan import model as model_plan

    cfg = model_config("qwen3.5-0.8b", 4)
    m, plan = cfg.model, model_plan(cfg)
    floor = floor_bytes(cfg, plan, 100)
    params = sum(int(np.prod(w.shape)) for w in plan.weights.values())
    f32 = sum(int(np.prod(w.shape)) for w in plan.weights.values() if w.dtype == "float32")
    assert floor["weights"] == 2 * params + 2 * f32 and "lm_head" not in plan.weights
    state = m.n_v_heads * m.head_v_dim * m.head_k_dim + m.conv_dim * (m.conv_kernel - 1)
    assert floor["states"] == 4 * 2 * 4 * state * m.layer_types.count("gdn")
    assert floor["kv"] == 4 * m.layer_types.count("attention") * 102 * 2 * m.n_kv_heads * m.head_dim * 2
