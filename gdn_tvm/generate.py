"""`python -m gdn_tvm.generate`: decode text (or token ids) with the whole model, streaming tokens as they come.

  python -m gdn_tvm.generate --checkpoint DIR --prompt "The capital of France is" --max-new-tokens 64
  python -m gdn_tvm.generate --preset qwen3.5-0.8b --random-weights --prompt-ids 1,2,3 --batch 8   # speed runs

Weights come from a Hugging Face checkpoint directory (its `tokenizer.json` through the `tokenizers` package, its
EOS ids from `generation_config.json` or `config.json`) or are random at a preset's sizes. Kernels come from a build
(`--library`, `make build` with `--ops model`) or are compiled here from the hand schedules. `--batch` decodes that
many copies of the prompt together (seeds `seed`, `seed + 1`, ...). Ends with the prompt's and the decode's tokens/s.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from gdn_tvm.config import DTYPE_FIELDS, DTYPES, PRESETS, DecodeConfig, preset
from gdn_tvm.runtime.model import Model, Request, check_request, checkpoint_weights
from gdn_tvm.runtime.weights import random_model_weights


def _arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m gdn_tvm.generate", description=__doc__.split("\n")[0])
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="a Hugging Face Qwen3.5 checkpoint directory")
    source.add_argument("--preset", choices=sorted(PRESETS), help="random weights at a preset's sizes")
    p.add_argument("--random-weights", action="store_true", help="required with --preset: says the weights are noise")
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text (needs the checkpoint's tokenizer.json)")
    prompt.add_argument("--prompt-ids", help="comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="1: off")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=1, help="copies of the prompt decoded together")
    p.add_argument("--max-len", type=int, default=4096, help="KV rows per lane")
    p.add_argument("--split-len", type=int, default=DecodeConfig.split_len)
    for field in DTYPE_FIELDS:
        default = getattr(DecodeConfig, field)
        p.add_argument(f"--{field.replace('_', '-')}", default=default, choices=DTYPES, help=f"default {default}")
    p.add_argument("--target", default="auto", choices=("auto", "llvm", "cuda"))
    p.add_argument("--library", help="a build (manifest, build folder or build root) holding the model's kernels")
    p.add_argument("--no-graph", action="store_true", help="CUDA: launch eagerly instead of replaying a CUDA graph")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; 2 with a message naming the bad argument, file or field (through argparse), never a trace."""
    from gdn_tvm.runtime.module import ManifestError
    from gdn_tvm.signature import ArgumentError

    parser = _arguments()
    args = parser.parse_args(argv)
    if args.preset and not args.random_weights:
        parser.error("--preset decodes random weights: add --random-weights (or give --checkpoint)")
    for option, value in (("--checkpoint", args.checkpoint), ("--library", args.library)):
        if value == "":
            parser.error(f"{option}: expected a directory, got an empty path")
    if args.checkpoint and args.random_weights:
        parser.error("--random-weights goes with --preset: a checkpoint's weights are its own")
    try:
        return _generate(parser, args)
    except (ArgumentError, ManifestError, ValueError) as err:  # a checkpoint, build or request that fails a check
        parser.error(str(err))


def _text(tokenizer, tokens: list[int]) -> str:
    """`tokens` decoded, an id the tokenizer lacks (a padded vocabulary's) shown as `<id>` rather than dropped."""
    known = [t for t in tokens if tokenizer.id_to_token(t) is not None]
    if len(known) == len(tokens):
        return tokenizer.decode(tokens)
    return "".join(tokenizer.decode([t]) if t in known else f"<{t}>" for t in tokens)


def _step_bytes(plan, role: str | None = None) -> int:
    """Bytes a model step's buffers take on its device: weights, states, caches, activations (views share theirs);
    those of one `role` only where given."""
    buffers = [b for b in plan.buffers.values() if b.role != "view" and role in (None, b.role)]
    return sum(math.prod(b.shape) * np.dtype(b.dtype).itemsize for b in buffers)


def _generate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    import tvm

    from gdn_tvm.plan import model as model_plan
    from gdn_tvm.runtime.checkpoint import checkpoint_config, load_checkpoint, stop_ids
    from gdn_tvm.target import gpu_present, memory_bytes

    if args.target == "cuda" and not gpu_present():
        parser.error("--target cuda: no CUDA GPU is present")
    for flag, value in (("--seed", args.seed), ("--temperature", args.temperature), ("--top-k", args.top_k)):
        if value < 0:
            parser.error(f"{flag}: expected 0 or more, got {value}")
    dtypes = {field: getattr(args, field) for field in DTYPE_FIELDS}
    tokenizer, stops = None, []
    if args.checkpoint:  # its config, stop ids and tokenizer now; its weights once every argument has passed
        m = checkpoint_config(args.checkpoint)
        stops = stop_ids(args.checkpoint, m)
        vocabulary = Path(args.checkpoint) / "tokenizer.json"
        if vocabulary.exists():
            from tokenizers import Tokenizer

            try:
                tokenizer = Tokenizer.from_file(str(vocabulary))
            except Exception as err:  # the tokenizers package raises plain Exceptions
                raise ValueError(f"{vocabulary}: unreadable: {err}") from None
            if tokenizer.get_vocab_size() > m.vocab_size:  # its ids would index past the embedding
                raise ValueError(
                    f"{vocabulary}: {tokenizer.get_vocab_size()} tokens, the model's vocab_size is "
                    f"{m.vocab_size}: not this model's tokenizer"
                )
    else:
        m = preset(args.preset)
    if args.prompt is not None:
        if tokenizer is None:
            parser.error("--prompt needs a checkpoint with tokenizer.json; give --prompt-ids")
        try:
            ids = tokenizer.encode(args.prompt).ids
        except Exception as err:  # the tokenizers package raises plain Exceptions
            raise ValueError(f"--prompt: {vocabulary} cannot encode it: {err}") from None
    else:
        try:
            ids = [int(t) for t in args.prompt_ids.split(",")]
        except ValueError:
            parser.error(f"--prompt-ids: expected comma-separated token ids, got {args.prompt_ids!r}")
    cfg = DecodeConfig(m, batch=args.batch, max_len=args.max_len, split_len=args.split_len, **dtypes)
    on_gpu = args.target == "cuda" or (args.target == "auto" and gpu_present())
    sampling = args.temperature > 0  # greedy decoding takes `argmax` (one launch), not `sample`'s chain of 35
    device, plan = tvm.cuda(0) if on_gpu else tvm.cpu(0), model_plan(cfg, sampling)
    need, have = _step_bytes(plan), memory_bytes(device)
    # the weights' host arrays, read or made before the step copies them (random ones in float32)
    held = _step_bytes(plan, "weight") * (1 if args.checkpoint else 4 // np.dtype(cfg.weight_dtype).itemsize)
    if not on_gpu:  # they stay beside the step's copies
        need += held
    if need > have:
        parser.error(
            f"--batch {args.batch}, --max-len {args.max_len}: the step's buffers take {need / 2**30:.1f} GiB, "
            f"the {'GPU' if on_gpu else 'host'} has {have / 2**30:.1f} GiB"
        )
    if on_gpu and held > (host := memory_bytes(tvm.cpu(0))):
        parser.error(
            f"{m.name}: its weights take {held / 2**30:.1f} GiB of host memory, the host has {host / 2**30:.1f} GiB"
        )
    draw = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p}
    requests = [Request(ids, args.max_new_tokens, seed=args.seed + i, **draw) for i in range(args.batch)]
    for request in requests:  # before any weight is read or anything compiles
        check_request(cfg, request, sampling)
    kind = "cuda" if on_gpu else "llvm"
    started = time.perf_counter()
    if args.library:  # the TVM runtime alone; a bad build is named before any weight is read
        from gdn_tvm.runtime.module import load

        kernels = load(args.library, cfg, kind)
    else:
        from gdn_tvm.codegen.compile import build_kernels
        from gdn_tvm.target import cuda, llvm

        kernels = build_kernels(cfg, cuda() if on_gpu else llvm(), plan.ops)
    if args.checkpoint:
        weights = checkpoint_weights(load_checkpoint(args.checkpoint, args.weight_dtype))
    else:
        weights = random_model_weights(m, np.random.default_rng(args.seed))
    model = Model(cfg, kernels, device, weights, stops, sampling)
    if on_gpu and not args.no_graph:
        model.capture()
    print(
        f"ready in {time.perf_counter() - started:.1f} s ({kind}, {m.name}, B={args.batch})",
        file=sys.stderr,
    )
    arrivals: list[float] = []

    def on_token(index: int, token: int) -> None:
        arrivals.append(time.perf_counter())
        if index == 0 and args.batch == 1:
            print(_text(tokenizer, [token]) if tokenizer else f"{token} ", end="", flush=True)

    start = time.perf_counter()
    out = model.generate(requests, on_token)
    print()
    if args.batch > 1:
        for i, tokens in enumerate(out):
            print(f"[{i}] " + (_text(tokenizer, tokens) if tokenizer else " ".join(map(str, tokens))))
    if arrivals:
        first, last = arrivals[0] - start, arrivals[-1] - arrivals[0]
        decoded = len(arrivals) - args.batch  # tokens after each lane's first
        prompt_rate = len(ids) * args.batch / first
        decode_rate = decoded / last if last > 0 else float("nan")
        prompt_line = f"prompt: {len(ids)} tokens x {args.batch} in {first * 1e3:.1f} ms ({prompt_rate:.1f} tokens/s)"
        decode_line = f"decode: {decoded} tokens in {last * 1e3:.1f} ms ({decode_rate:.1f} tokens/s)"
        print(f"{prompt_line}; {decode_line}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
