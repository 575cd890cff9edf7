"""The options `make tune` and `make build` share: the decode shapes, the target and the ops to cover."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gdn_tvm.config import DEFAULT_PRESET, DTYPE_FIELDS, DTYPES, HEAD_MAPPINGS, PRESETS, DecodeConfig, preset
from gdn_tvm.plan import model_ops, step_ops
from gdn_tvm.registry import OPS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--preset --batch --slots --max-len --split-len --head-mapping --weight-dtype --kv-dtype --state-dtype --target
    --ops`."""
    parser.add_argument("--preset", default=DEFAULT_PRESET, choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=1, help="lanes decoded together (default 1)")
    parser.add_argument("--slots", type=int, default=0, help="state-pool slots (default: = batch)")
    parser.add_argument("--max-len", type=int, default=DecodeConfig.max_len, help="KV rows per slot")
    parser.add_argument("--split-len", type=int, default=DecodeConfig.split_len, help="positions per split-KV chunk")
    parser.add_argument("--head-mapping", default="grouped", choices=HEAD_MAPPINGS)
    add_dtype_arguments(parser)
    parser.add_argument("--target", default="auto", choices=("auto", "llvm", "cuda"))
    parser.add_argument(
        "--ops",
        help=f"comma-separated registry op names, 'all' (those of the {len(OPS)} registry ops the model has) or "
        "'model' (the whole model's step, for `python -m gdn_tvm.generate --library`); default: the ops a mixer "
        "step launches (gdn_tvm.plan)",
    )


def add_dtype_arguments(parser: argparse.ArgumentParser) -> None:
    """`--weight-dtype --kv-dtype --state-dtype`: `DecodeConfig`'s storage dtypes (default: its defaults)."""
    for field in DTYPE_FIELDS:
        default = getattr(DecodeConfig, field)
        parser.add_argument(f"--{field.replace('_', '-')}", default=default, choices=DTYPES, help=f"default {default}")


def dtypes(args: argparse.Namespace) -> dict[str, str]:
    """The storage dtypes the options name, by `DecodeConfig` field."""
    return {field: getattr(args, field) for field in DTYPE_FIELDS}


def decode_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> DecodeConfig:
    """The `DecodeConfig` the options describe (exits through `parser.error` naming a size it refuses)."""
    try:
        return DecodeConfig(
            preset(args.preset),
            batch=args.batch,
            slots=args.slots,
            max_len=args.max_len,
            split_len=args.split_len,
            **dtypes(args),
        ).replace(head_mapping=args.head_mapping)
    except ValueError as err:  # names the field: batch, slots, max_len, split_len
        parser.error(str(err))


def folder(parser: argparse.ArgumentParser, option: str, path: str, write: bool = True) -> str:
    """`path`, which `option` names as a folder to read or (`write`) to write: exits through `parser.error` where it
    is a file, or where it is to be written and its nearest existing folder is a file or cannot be written."""
    if Path(path).exists() and not Path(path).is_dir():
        parser.error(f"{option} {path}: not a folder")
    if write:
        existing = next(p for p in (Path(path).absolute(), *Path(path).absolute().parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            parser.error(f"{option} {path}: cannot be written ({existing} is not a writable folder)")
    return path


def op_names(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: DecodeConfig) -> list[str]:
    """The ops `--ops` names (exits through `parser.error` naming unknown ones)."""
    if args.ops is None:
        return step_ops(cfg)
    if args.ops == "all":
        return [name for name, op in OPS.items() if op.applies(cfg)]
    if args.ops == "model":  # with sampling and greedy
        return model_ops(cfg)
    names = args.ops.split(",")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        parser.error(f"--ops names {twice} more than once")
    unknown = [n for n in names if n not in OPS]
    if unknown:
        parser.error(f"unknown ops {unknown}; known: {', '.join(OPS)}")
    absent = [n for n in names if not OPS[n].applies(cfg)]
    if absent:
        parser.error(f"--ops {','.join(absent)}: not an op of {cfg.model.name}")
    return names
