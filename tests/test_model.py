"""The whole model against Hugging Face: a tiny random Qwen3.5 made and saved by `transformers` (float32 and bf16,
tied and untied LM head), loaded by the checkpoint loader and decoded on llvm kernels; every step's logits against
transformers' on the same tokens, and the same greedy tokens. Also three lanes on scattered slots, one finishing
early and its lane refilled, sampling reproducible, and requests refused by name."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tvm
from test_checkpoint import TINY

from gdn_tvm import plan
from gdn_tvm.codegen.compile import build_kernels
from gdn_tvm.config import DecodeConfig
from gdn_tvm.plan import LIBRARY_GEMM_LANES, LIBRARY_GEMM_MIN_LANES
from gdn_tvm.plan import model as model_plan
from gdn_tvm.runtime.checkpoint import load_checkpoint
from gdn_tvm.runtime.model import Model, Request, _Graphs, checkpoint_weights
from gdn_tvm.signature import ArgumentError
from gdn_tvm.target import llvm
from gdn_tvm.verify import tolerance

STEPS = 64  # decoded tokens a request
_KERNELS: dict[tuple[DecodeConfig, tuple[str, ...]], dict] = {}


def save_hf_model(path, seed: int, tied: bool, dtype: str, **sizes):
    """A tiny random `Qwen3_5ForCausalLM` (`TINY`, with `sizes` replacing its fields) saved in `dtype`; returns it in
    float32 holding the saved values (a bf16 checkpoint's weights widened: float32 math on the stored weights, as our
    kernels do)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen3_5TextConfig(**(TINY | sizes), tie_word_embeddings=tied)
    model = transformers.Qwen3_5ForCausalLM(config)
    with torch.no_grad():  # spreads like a trained model's (the defaults: zero norms, 0.02-std projections)
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # the gated norm multiplies by w itself
                p.uniform_(0.5, 1.5)
            elif name.endswith("norm.weight"):  # zero-centred: the model multiplies by 1 + w
                p.normal_(0.0, 0.2)
            elif name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
            elif p.ndim == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(path)
    return model.float().eval()


def hf_logits(hf, tokens: list[int]) -> np.ndarray:
    """transformers' logits after each of `tokens`, fed one at a time through its cache: [len(tokens), V]."""
    import torch

    out, rows = None, []
    with torch.no_grad():
        for token in tokens:
            cache = None if out is None else out.past_key_values
            out = hf(input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True)
            rows.append(out.logits[0, -1].double().numpy())
    return np.stack(rows)


def ours(path, dtype: str, batch: int = 1, slots: int = 0, stop_ids=(), sampling: bool = True) -> Model:
    weight_dtype = "bfloat16" if dtype == "bfloat16" else "float32"
    ckpt = load_checkpoint(path, weight_dtype)
    cfg = DecodeConfig(
        ckpt.model, batch=batch, slots=slots, max_len=96, split_len=32, weight_dtype=weight_dtype, kv_dtype=weight_dtype
    )
    ops = tuple(model_plan(cfg, sampling).ops)
    if (cfg, ops) not in _KERNELS:
        _KERNELS[cfg, ops] = build_kernels(cfg, llvm(), ops)
    return Model(cfg, _KERNELS[cfg, ops], tvm.cpu(), checkpoint_weights(ckpt), stop_ids, sampling)


def decode(model: Model, requests: dict[int, Request]) -> tuple[dict, dict]:
    """The started `requests` (by lane) run to their ends, step by step: each lane's emitted tokens and its logits at
    every step it was live."""
    tokens = {lane: [] for lane in requests}
    logits = {lane: [] for lane in requests}
    live = set(requests)
    while live:
        events = model.events(model.launch())
        step_logits = model.logits.numpy()
        for lane in list(live):
            logits[lane].append(step_logits[lane].astype(np.float64))
            if events[0, lane] >= 0:
                tokens[lane].append(int(events[0, lane]))
            if events[1, lane]:
                live.discard(lane)
    return tokens, logits


def assert_matches_hf(hf, request: Request, tokens: list[int], logits: list[np.ndarray], tol: float, what: str):
    """Our logits at each step within `tol` (relative L-inf over the step's row) of transformers' on the same tokens,
    and each greedy token transformers' argmax where its top two are further apart than the error allowed."""
    fed = list(request.prompt) + tokens[:-1]
    ref = hf_logits(hf, fed)
    got = np.stack(logits)
    assert got.shape == ref.shape, f"{what}: {got.shape[0]} steps, transformers {ref.shape[0]}"
    err = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
    assert err.max() <= tol, f"{what}: step {int(err.argmax())} logits off by {err.max():.2e} (tolerance {tol:.0e})"
    n = len(request.prompt)
    for t, token in enumerate(tokens):
        row = ref[n - 1 + t]
        top2 = np.sort(row)[-2:]
        if top2[1] - top2[0] > 2 * tol * np.abs(row).max():
            assert token == int(row.argmax()), f"{what}: token {t} is {token}, transformers {int(row.argmax())}"


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_decode_matches_transformers(tmp_path, rng, dtype, tied):
    """64 greedy tokens after a 5-token prompt: every step's logits within the tolerance of the dtype (float32: 1e-4,
    bf16 weights and KV: the layer tolerance), the same tokens. B = 1: the plan with `fusions.block_stages`."""
    hf = save_hf_model(tmp_path, int(rng.integers(2**31)), tied, dtype)
    model = ours(tmp_path, dtype)
    assert "gemv_down_proj_residual" in model.bound.launched  # B = 1: the layer norms inside the GEMVs
    request = Request(prompt=rng.integers(0, TINY["vocab_size"], 5).tolist(), max_new_tokens=STEPS)
    model.start(request)
    tokens, logits = decode(model, {0: request})
    assert len(tokens[0]) == STEPS
    tol = 1e-4 if dtype == "float32" else tolerance((dtype,), layer=True)
    assert_matches_hf(hf, request, tokens[0], logits[0], tol, f"{dtype} {'tied' if tied else 'untied'}")


def test_odd_sizes_decode_as_transformers(tmp_path, rng):
    """A checkpoint whose stacked projections' parts do not start on `VIEW_ALIGN` bytes (hidden 60, intermediate 50:
    the stacks are joined on the host) decodes as transformers does."""
    hf = save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32", hidden_size=60, intermediate_size=50)
    model = ours(tmp_path, "float32")
    request = Request(rng.integers(0, TINY["vocab_size"], 3).tolist(), 8)
    model.start(request)
    tokens, logits = decode(model, {0: request})
    assert len(tokens[0]) == 8
    assert_matches_hf(hf, request, tokens[0], logits[0], 1e-4, "hidden 60, intermediate 50")


def test_three_lanes_on_scattered_slots_one_finishing_early(tmp_path, rng):
    """B = 3 on slots 4, 0 and 2 of 5: each lane's tokens and logits are transformers' for its request alone; the
    lane that finishes first is refilled on another slot, whose states start from zero."""
    hf = save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=3, slots=5)
    V = TINY["vocab_size"]
    requests = [Request(rng.integers(0, V, n).tolist(), budget) for n, budget in ((3, 40), (6, 9), (1, 33))]
    for request, slot in zip(requests, (4, 0, 2), strict=True):
        model.start(request, slot=slot)
    tokens, logits = decode(model, dict(enumerate(requests)))
    for lane, request in enumerate(requests):
        assert len(tokens[lane]) == request.max_new_tokens
        assert_matches_hf(hf, request, tokens[lane], logits[lane], 1e-4, f"lane {lane}")
    late = Request(rng.integers(0, V, 4).tolist(), 12)
    lane = model.start(late, slot=4)  # the slot lane 0 used: zeroed again
    tokens, logits = decode(model, {lane: late})
    assert_matches_hf(hf, late, tokens[lane], logits[lane], 1e-4, "refilled lane")


# (lanes, LIBRARY_GEMM_MIN_WEIGHT, ops the plan must launch): every projection a library GEMM; from the fewer lanes
# only the tiny model's larger ones (qkv, z, out_proj, gate|up, LM head), the rest GEMVs beside them. Where the first
# part of a stack is a library GEMM, the whole stack is one (`Fusions.library_stacks`): the GDN input projections both
# times, the attention's q|k|v with every projection a GEMM.
LIBRARY_PLANS = {
    "all": (
        LIBRARY_GEMM_LANES,
        plan.LIBRARY_GEMM_MIN_WEIGHT,
        {"split_bf16_intermediate", "gemm_qkv_proj", "gemm_down_proj", "swiglu"},
    ),
    "mixed": (LIBRARY_GEMM_MIN_LANES, 12288, {"gemv_q_proj", "swiglu", "gemv_down_proj"}),
}


@pytest.mark.parametrize("which", list(LIBRARY_PLANS))
def test_batched_library_gemms_decode_as_transformers(tmp_path, rng, monkeypatch, which):
    """With bf16 weights, from `LIBRARY_GEMM_LANES` lanes every projection is the library GEMM over x split into two
    bf16 rows (`split_bf16`, `gemm`, the SwiGLU apart), from `LIBRARY_GEMM_MIN_LANES` those of the larger weights
    ("mixed": the threshold lowered to the tiny model's sizes): three lanes decode as transformers does, within the
    bf16 layer tolerance, and within the float32 layer tolerance (1e-3: the bf16 KV cache rounds the plans' 1e-6 apart
    values to neighbouring bf16 values now and then) of the same model at B = 3 (GEMVs on float32 x), step for step."""
    lanes, min_weight, launched = LIBRARY_PLANS[which]
    monkeypatch.setattr(plan, "LIBRARY_GEMM_MIN_WEIGHT", min_weight)
    hf = save_hf_model(tmp_path, int(rng.integers(2**31)), True, "bfloat16")
    batched, small = ours(tmp_path, "bfloat16", batch=lanes), ours(tmp_path, "bfloat16", batch=3)
    assert launched | {"gemm_in_proj", "gemm_lm_head"} <= set(batched.bound.launched)
    assert not any(name.startswith(("gemm_in_proj_", "gemv_in_proj")) for name in batched.bound.launched)
    assert not any(name.startswith("gemm_") for name in small.bound.launched)
    V = TINY["vocab_size"]
    requests = [Request(rng.integers(0, V, n).tolist(), budget) for n, budget in ((3, 40), (6, 9), (1, 33))]
    for model in (batched, small):
        for request, slot in zip(requests, (2, 0, 1), strict=True):
            model.start(request, slot=slot)
    (tokens, logits), (small_tokens, small_logits) = (decode(m, dict(enumerate(requests))) for m in (batched, small))
    for lane, request in enumerate(requests):
        assert tokens[lane] == small_tokens[lane], f"lane {lane}"
        got, want = np.stack(logits[lane]), np.stack(small_logits[lane])
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err <= tolerance(("float32",), layer=True), f"lane {lane}: logits {err:.2e} from the GEMV plan's"
        assert_matches_hf(hf, request, tokens[lane], logits[lane], tolerance(("bfloat16",), layer=True), f"lane {lane}")


def test_generate_refills_lanes_stops_at_eos_and_samples_reproducibly(tmp_path, rng):
    """`generate` over more requests than lanes: greedy requests give the tokens of one at a time; a stop id ends a
    request (emitted, then nothing more); a sampled request gives the same tokens on any lane and batch."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    V = TINY["vocab_size"]
    prompts = [rng.integers(0, V, n).tolist() for n in (2, 5, 1, 3, 4)]
    sampled = Request(prompts[0], 20, temperature=0.8, top_k=50, top_p=0.9, seed=1234)
    requests = [sampled] + [Request(p, 15) for p in prompts[1:]]
    alone = [ours(tmp_path, "float32").generate([r])[0] for r in requests]
    batched = ours(tmp_path, "float32", batch=2, slots=3).generate(requests)
    assert batched == alone
    stop = alone[1][6]
    stopped = ours(tmp_path, "float32", batch=2, slots=3, stop_ids=[stop]).generate(requests[1:2])[0]
    assert stopped == alone[1][: alone[1].index(stop) + 1]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt", [], "prompt: expected 1 to 96 integer token ids, got none"),
        ("prompt", [1, 10**6], "prompt"),
        ("max_new_tokens", 0, "max_new_tokens"),
        ("temperature", float("nan"), "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1e-50, "top_p: 1e-50 is not a finite float32"),  # zero as the sampler holds it
        ("temperature", 1e39, "temperature: 1e\\+39 is not a finite float32"),
        ("seed", 2**70, r"seed: expected an int in \[-2\^31, 2\^63\)"),
        ("temperature", "0.5", "temperature: expected a number"),
        ("temperature", True, "temperature: expected a number"),
        ("top_p", np.array([0.5, 0.9]), "top_p: expected a number"),
        ("top_p", [0.9], "top_p: expected a number"),
    ],
)
def test_a_bad_request_is_refused_by_name_and_changes_nothing(tmp_path, rng, field, value, message):
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32")
    before = {name: t.numpy().copy() for name, t in model.inputs.items()}
    fields = {"prompt": [1, 2], "max_new_tokens": 4} | {field: value}
    with pytest.raises(ArgumentError, match=message):
        model.start(Request(**fields))
    for name, t in model.inputs.items():
        np.testing.assert_array_equal(t.numpy(), before[name], err_msg=name)


def test_a_bad_slot_is_refused_by_name_and_leaves_every_lane_free(tmp_path, rng):
    """A slot that is not a free slot's int index (a float or bool equal to one, one out of range) is refused naming
    `slot`, before any lane or slot is taken or any input written: the next request decodes as on a fresh model."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=1, slots=2)
    with pytest.raises(RuntimeError, match=r"capture\(\) makes CUDA graphs: this model runs on cpu"):
        model.capture()
    before = {name: t.numpy().copy() for name, t in model.inputs.items()}
    for slot in (1.0, True, 2, -1, "1"):
        with pytest.raises(ArgumentError, match="slot: expected a free slot"):
            model.start(Request([1, 2], 3), slot=slot)
    for name, t in model.inputs.items():
        np.testing.assert_array_equal(t.numpy(), before[name], err_msg=name)
    assert model.generate([Request([1, 2], 3)]) == ours(tmp_path, "float32", batch=1, slots=2).generate(
        [Request([1, 2], 3)]
    )


def test_a_steps_events_are_read_once_and_before_its_ticket_comes_round(tmp_path, rng):
    """`events(ticket)` frees the lanes that finished once: a second read, a ticket never launched or one launched
    before `reset_lanes` is refused naming `ticket`, and a third launch before the first's events are read is refused,
    so no lane is ever freed twice (two requests on one lane) or lost."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=2, slots=3)
    model.start(Request([5], 1))  # finishes on its first step
    ticket = model.launch()
    assert model.events(ticket)[1].sum() == 1
    for bad in (ticket, 1 - ticket, 7, True):
        with pytest.raises(ArgumentError, match="ticket: expected an unread ticket"):
            model.events(bad)
    lanes = [model.start(Request([1, 2], 6)), model.start(Request([3], 6))]
    assert sorted(lanes) == [0, 1]
    with pytest.raises(RuntimeError, match="lanes are busy"):
        model.start(Request([4], 6))
    first, _ = model.launch(), model.launch()
    with pytest.raises(RuntimeError, match=f"events of ticket {first} are unread"):
        model.launch()
    model.events(first)
    model.reset_lanes()
    with pytest.raises(ArgumentError, match="ticket"):
        model.events(1 - first)


@pytest.mark.parametrize("budget", [2**63 - 1, np.int32(2**31 - 1), np.int64(2**63 - 1), np.uint64(2**64 - 1)])
def test_a_budget_past_the_cache_decodes_to_the_cache_end(tmp_path, rng, budget):
    """`max_new_tokens` as large as its integer type holds (numpy's wrap around) ends at the cache's last row."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32")
    lane = model.start(Request([1, 2], budget))
    assert model.inputs["limits"].numpy()[lane] == model.cfg.max_len


def test_a_model_refuses_stop_ids_that_are_not_integers_by_name(tmp_path, rng):
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    for stops in ("12", [2.9], ["7"], 5, [True]):
        with pytest.raises(ArgumentError, match="stop_ids: expected integer token ids"):
            ours(tmp_path, "float32", stop_ids=stops)


def test_a_model_refuses_stop_ids_it_cannot_hold_by_name(tmp_path, rng):
    """More than STOP_IDS ids, or one outside the vocabulary: `ArgumentError` naming `stop_ids` (the limits
    `checkpoint.stop_ids` holds a checkpoint's EOS ids to, naming the file)."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    for stops in ([TINY["vocab_size"]], [-1], list(range(9))):
        with pytest.raises(ArgumentError, match=rf"stop_ids: expected at most 8 ids in \[0, {TINY['vocab_size']}\)"):
            ours(tmp_path, "float32", stop_ids=stops)


def test_generate_cli_streams_a_checkpoints_tokens(tmp_path, rng, capsys):
    """`python -m gdn_tvm.generate --checkpoint DIR --prompt-ids ...` prints the greedy tokens as they come and ends
    with the prompt's and the decode's tokens/s; --preset needs --random-weights."""
    from gdn_tvm import generate

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    prompt = rng.integers(0, TINY["vocab_size"], 3).tolist()
    expect = ours(tmp_path, "bfloat16").generate([Request(prompt, 12)])[0]  # the CLI's default storage
    args = ["--checkpoint", str(tmp_path), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "12"]
    assert generate.main([*args, "--target", "llvm", "--max-len", "96", "--split-len", "32"]) == 0
    out = capsys.readouterr()
    assert out.out.split() == [str(t) for t in expect]
    assert "prompt: 3 tokens" in out.err and "decode: 11 tokens" in out.err
    with pytest.raises(SystemExit):
        generate.main(["--preset", "qwen3.5-0.8b", "--prompt-ids", "1"])
    assert "--random-weights" in capsys.readouterr().err


def test_a_greedy_model_decodes_as_the_sampling_one_and_refuses_temperature(tmp_path, rng):
    """`Model(sampling=False)` (`argmax` in place of `sample`) gives the tokens and logits of the sampling model at
    temperature 0, and refuses a request that samples, by name."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    sampling, greedy = ours(tmp_path, "float32"), ours(tmp_path, "float32", sampling=False)
    assert "argmax" in greedy.bound.launched and "sample" not in greedy.bound.launched
    request = Request(rng.integers(0, TINY["vocab_size"], 4).tolist(), 20)
    for model in (sampling, greedy):
        model.start(request)
    runs = [decode(model, {0: request}) for model in (sampling, greedy)]
    assert runs[0][0] == runs[1][0]
    np.testing.assert_array_equal(np.stack(runs[0][1][0]), np.stack(runs[1][1][0]))
    with pytest.raises(ArgumentError, match="temperature"):
        greedy.start(Request([1], 4, temperature=0.5))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt-ids", "1,x"], "--prompt-ids"),
        (["--prompt-ids", "1,100000"], "prompt"),
        (["--prompt-ids", "1", "--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt-ids", "1", "--batch", "0"], "batch"),
        (["--prompt-ids", "1", "--batch", str(2**31 - 1)], f"batch={2**31 - 1}: the logits would hold"),
        (["--prompt-ids", "1", "--max-len", str(2**30)], f"--batch 1, --max-len {2**30}: the step's buffers"),
        (["--prompt-ids", "1", "--temperature", "-1"], "--temperature: expected 0 or more"),
        (["--prompt-ids", "1", "--top-k", "-3"], "--top-k: expected 0 or more"),
        (["--prompt-ids", "1", "--random-weights"], "--random-weights goes with --preset"),
    ],
)
def test_generate_cli_refuses_bad_arguments_by_name(tmp_path, rng, capsys, args, message):
    """Exit status 2 and a message naming the argument, no traceback: bad ids, an id past the vocabulary, no tokens to
    generate, no lanes, more lanes than memory holds; and a checkpoint directory without config.json, by file."""
    from gdn_tvm import generate

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    common = ["--checkpoint", str(tmp_path), "--target", "llvm", "--max-len", "96", "--split-len", "32"]
    with pytest.raises(SystemExit) as exit_:
        generate.main([*common, *args])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        generate.main(["--checkpoint", str(tmp_path / "missing"), "--prompt-ids", "1"])
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("file", "text", "message"),
    [
        ("generation_config.json", "[1]", "generation_config.json: expected a JSON object, got [1]"),
        ("generation_config.json", "{not json", "generation_config.json: not a JSON file"),
        ("generation_config.json", '{"eos_token_id": "12"}', "generation_config.json: eos_token_id: expected an int"),
        ("generation_config.json", '{"eos_token_id": true}', "generation_config.json: eos_token_id: expected an int"),
        ("generation_config.json", '{"eos_token_id": [[1]]}', "generation_config.json: eos_token_id: expected an int"),
        ("generation_config.json", '{"eos_token_id": [1, -1]}', "generation_config.json: eos_token_id: expected at"),
        ("generation_config.json", '{"eos_token_id": 999999}', "eos_token_id: expected at most 8 ids in [0, "),
        ("tokenizer.json", "{not json", "tokenizer.json: unreadable"),
    ],
)
def test_generate_cli_names_a_bad_checkpoint_file(tmp_path, rng, capsys, file, text, message):
    """A checkpoint's generation_config.json or tokenizer.json that cannot be read, or holds EOS ids of another kind
    or past the vocabulary: exit status 2 naming the file, before anything compiles."""
    from gdn_tvm import generate

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    (tmp_path / file).write_text(text)
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--checkpoint", str(tmp_path), "--target", "llvm", "--prompt-ids", "1"])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_generate_cli_refuses_another_models_tokenizer_and_shows_ids_it_lacks(tmp_path, rng, capsys):
    """A tokenizer with more tokens than the model's vocabulary is another model's: exit status 2 naming it. A
    generated id that a smaller tokenizer lacks (a padded vocabulary's) is shown as `<id>`, not dropped."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from gdn_tvm import generate

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    big = {f"w{i}": i for i in range(TINY["vocab_size"] + 1)}
    Tokenizer(models.WordLevel(big, unk_token="w0")).save(str(tmp_path / "tokenizer.json"))
    args = ["--checkpoint", str(tmp_path), "--target", "llvm", "--max-len", "96", "--split-len", "32"]
    with pytest.raises(SystemExit) as exit_:
        generate.main([*args, "--prompt", "w1 w2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "tokenizer.json: 321 tokens, the model's vocab_size is 320" in err
    small = Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a"))
    small.pre_tokenizer = pre_tokenizers.Whitespace()
    small.save(str(tmp_path / "tokenizer.json"))
    expect = ours(tmp_path, "bfloat16").generate([Request([0, 1], 4)])[0]
    assert generate.main([*args, "--prompt", "a b", "--max-new-tokens", "4"]) == 0
    shown = "".join("a" if t == 0 else "b" if t == 1 else f"<{t}>" for t in expect)
    assert capsys.readouterr().out.strip() == shown


def test_generate_cli_names_a_prompt_the_tokenizer_cannot_encode(tmp_path, rng, capsys):
    """A word-level tokenizer without an unknown token cannot encode a word it lacks: exit status 2 naming --prompt
    and the tokenizer's file, not the tokenizers package's traceback."""
    from tokenizers import Tokenizer, models

    from gdn_tvm import generate

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token=None)).save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--checkpoint", str(tmp_path), "--target", "llvm", "--prompt", "zebra"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--prompt: " in err and "tokenizer.json cannot encode it" in err


def test_model_ops_are_what_build_and_tune_take_for_the_model():
    """`--ops model` (make build / make tune): every op of the sampling and the greedy step, each once."""
    import argparse

    from gdn_tvm import cli
    from gdn_tvm.config import preset
    from gdn_tvm.plan import model_ops

    cfg = DecodeConfig(preset("qwen3.5-0.8b"), batch=1)
    names = model_ops(cfg)
    assert {"sample", "argmax", "embedding", "gemv_lm_head"} <= set(names) and len(names) == len(set(names))
    assert set(names) == set(model_plan(cfg).ops) | set(model_plan(cfg, sampling=False).ops)
    assert cli.op_names(argparse.ArgumentParser(), argparse.Namespace(ops="model"), cfg) == names


def test_memory_bytes_reads_the_gpu_global_memory_and_the_host_available_memory():
    """(No GPU needed: a stand-in CUDA device.) `generate`'s size check compares with these; the host's is what it
    can give now, at most its physical memory."""
    from gdn_tvm.target import memory_bytes

    class FakeCuda:
        total_global_memory = 141 * 10**9

        def dlpack_device_type(self):
            return tvm.cuda(0).dlpack_device_type()

    assert memory_bytes(FakeCuda()) == 141 * 10**9
    assert 2**30 < memory_bytes(tvm.cpu(0)) <= os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_generate_cli_checks_every_argument_before_it_reads_a_weight(tmp_path, rng, capsys):
    """A bad argument or build is named even where the checkpoint's weights could not be read (they are read last),
    and an empty --checkpoint or --library is refused as such."""
    from gdn_tvm import generate

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    for shard in tmp_path.glob("*.safetensors"):
        shard.write_bytes(b"not a safetensors file")
    common = ["--checkpoint", str(tmp_path), "--target", "llvm", "--max-len", "96", "--split-len", "32"]
    for args, message in (
        (["--prompt-ids", "1,x"], "--prompt-ids"),
        (["--prompt-ids", "1", "--max-new-tokens", "0"], "max_new_tokens"),
        (["--prompt-ids", "1", "--library", str(tmp_path / "no_build")], "no manifest.json for "),
        (["--prompt-ids", "1"], ".safetensors"),  # every argument passed: the weights are read, and refused
    ):
        with pytest.raises(SystemExit) as exit_:
            generate.main([*common, *args])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
    for option in ("--checkpoint", "--library"):
        with pytest.raises(SystemExit) as exit_:
            generate.main(["--checkpoint", str(tmp_path), "--prompt-ids", "1", option, ""])
        assert exit_.value.code == 2 and f"{option}: expected a directory, got an empty path" in capsys.readouterr().err


def test_an_on_token_that_raises_leaves_the_model_usable(tmp_path, rng):
    """An exception from `on_token` (or an interrupt) mid-`generate` propagates; the model's lanes, slots and unread
    steps are released, so the next `generate` decodes as a fresh model does."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=2)
    requests = [Request([1, 2], 6), Request([3], 5)]

    def fail(index: int, token: int) -> None:
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        model.generate(requests, fail)
    assert model.generate(requests) == ours(tmp_path, "float32", batch=2).generate(requests)
    with pytest.raises(ArgumentError, match=r"request: expected a Request, got \(\[1, 2\], 3\)"):
        model.generate([([1, 2], 3)])


def test_generate_cli_refuses_cuda_without_a_gpu_and_a_negative_seed(tmp_path, rng, capsys, monkeypatch):
    from gdn_tvm import generate, target

    monkeypatch.setattr(target, "gpu_present", lambda: False)
    for args, message in ((["--target", "cuda"], "--target cuda: no CUDA GPU"), (["--seed", "-1"], "--seed")):
        with pytest.raises(SystemExit) as exit_:
            generate.main(["--preset", "qwen3.5-0.8b", "--random-weights", "--prompt-ids", "1", *args])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_threads_sharing_a_model_each_get_their_requests_tokens(tmp_path, rng):
    """`generate` from two threads on one model: the lock keeps their lanes apart, each gets its own tokens."""
    import threading

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=2, slots=2)
    requests = [Request(rng.integers(0, TINY["vocab_size"], 3).tolist(), 10) for _ in range(2)]
    alone = [model.generate([r])[0] for r in requests]
    got: dict[int, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: got.update({i: model.generate([requests[i]])[0]})) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[0], got[1]] == alone


def test_generate_refuses_lanes_it_does_not_own_and_the_caller_keeps_them(tmp_path, rng):
    """Each step's events hold every live lane's token: `generate` with a lane started (or a step launched) by the
    caller is refused before it starts or reads anything, and the caller's request still decodes all its tokens."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=2)
    request = Request([1, 2], 6)
    alone = ours(tmp_path, "float32", batch=2).generate([request])[0]
    lane = model.start(request)
    ticket = model.launch()
    with pytest.raises(RuntimeError, match=rf"generate\(\) with lanes \[{lane}\] live and tickets \[{ticket}\] unread"):
        model.generate([Request([7], 3)])
    tokens = decode_started(model, lane, ticket)
    assert tokens == alone
    assert model.generate([request]) == [alone]


def decode_started(model: Model, lane: int, ticket: int) -> list[int]:
    """`lane`'s tokens from the step of `ticket` (launched, unread) until it finishes."""
    tokens = []
    while True:
        events = model.events(ticket)
        if events[0, lane] >= 0:
            tokens.append(int(events[0, lane]))
        if events[1, lane]:
            return tokens
        ticket = model.launch()


def test_reset_lanes_from_on_token_ends_generate_saying_so(tmp_path, rng):
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=2)
    requests = [Request([1, 2], 6), Request([3], 5)]
    with pytest.raises(RuntimeError, match=r"reset_lanes\(\) was called while it ran"):
        model.generate(requests, lambda index, token: model.reset_lanes())
    assert model.generate(requests) == ours(tmp_path, "float32", batch=2).generate(requests)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m: m.generate(None), "requests: expected an iterable of Request objects, got None"),
        (lambda m: m.generate(Request([1], 2)), "requests: expected an iterable of Request objects, got Request"),
        (lambda m: m.generate([Request([1], 2)], "x"), "on_token: expected a callable or None, got 'x'"),
        (lambda m: m.start(([1, 2], 3)), r"request: expected a Request, got \(\[1, 2\], 3\)"),
        (lambda m: m.start(Request([[1], [2, 3]], 3)), r"prompt: expected 1 to 96 integer token ids, got \[\[1\]"),
    ],
)
def test_bad_arguments_of_generate_and_start_are_refused_by_name(tmp_path, rng, call, message):
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32")
    before = {name: t.numpy().copy() for name, t in model.inputs.items()}
    with pytest.raises(ArgumentError, match=message):
        call(model)
    for name, t in model.inputs.items():
        np.testing.assert_array_equal(t.numpy(), before[name], err_msg=name)
    assert model.generate([Request([1, 2], 3)]) == ours(tmp_path, "float32").generate([Request([1, 2], 3)])


def test_weights_the_model_would_not_read_are_refused_by_name(tmp_path, rng):
    """A name the plan lacks (a misspelling, another model's extra layers) is refused, as is weights that are not a
    mapping and a torch tensor without data; a tied model's `lm_head` is its embedding, as in transformers."""
    import torch

    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32")
    cfg, kernels = model.cfg, _KERNELS[model.cfg, tuple(model_plan(model.cfg, True).ops)]
    weights = checkpoint_weights(load_checkpoint(tmp_path, "float32"))
    assert cfg.model.tie_word_embeddings
    typo = dict(weights) | {"layers.0.input_layernorm.weight": np.full(cfg.model.hidden, np.nan, np.float32)}
    with pytest.raises(
        ArgumentError, match=r"model weights: 1 not of this model, e.g. \['layers.0.input_layernorm.weight'\]"
    ):
        Model(cfg, kernels, tvm.cpu(), typo)
    for bad, got in ((None, "NoneType"), (list(weights.items()), "list")):
        with pytest.raises(ArgumentError, match=f"model weights: expected a mapping of names to arrays, got {got}"):
            Model(cfg, kernels, tvm.cpu(), bad)
    meta = dict(weights) | {"norm": torch.empty(cfg.model.hidden, device="meta")}
    with pytest.raises(
        ArgumentError, match="weight norm: expected a dense tensor with data, got torch.strided on meta"
    ):
        Model(cfg, kernels, tvm.cpu(), meta)
    head = dict(weights) | {"lm_head": np.zeros((cfg.model.vocab_size, cfg.model.hidden), np.float32)}
    assert Model(cfg, kernels, tvm.cpu(), head).generate([Request([1, 2], 4)]) == model.generate([Request([1, 2], 4)])


@pytest.mark.skipif(tvm.runtime.enabled("cuda") and tvm.cuda(0).exist, reason="a CUDA GPU is present")
def test_a_device_that_is_not_here_is_refused_by_name(tmp_path, rng):
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32")
    kernels = _KERNELS[model.cfg, tuple(model_plan(model.cfg, True).ops)]
    weights = checkpoint_weights(load_checkpoint(tmp_path, "float32"))
    with pytest.raises(ArgumentError, match=r"device: cuda:0 is not present here \(the model's tensors live on it\)"):
        Model(model.cfg, kernels, tvm.cuda(0), weights)


def test_lanes_that_finish_while_steps_are_timed_are_free_again(tmp_path, rng, monkeypatch):
    """`elapsed` reads no events: a lane that finishes during it is freed from the slots the step left, so the
    model takes requests again (the graphs stood in for by eager steps: timing needs a GPU)."""
    save_hf_model(tmp_path, int(rng.integers(2**31)), True, "float32")
    model = ours(tmp_path, "float32", batch=1, slots=1)
    monkeypatch.setattr(_Graphs, "elapsed", lambda graphs, steps: [model.bound.run() for _ in range(steps)] and 0.0)
    model._readback = object.__new__(_Graphs)
    model.start(Request([1, 2], 3))
    assert model.elapsed(8) == 0.0
    assert not model._lane_slot and list(model._free_lanes) == [0] and list(model._free_slots) == [0]
