"""Benchmark results as JSON, rewritten after every row so a run stopped by a time limit still leaves its rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch


def commit() -> str:
    """The commit measured: $GDN_TVM_COMMIT (set it in GPU commands: that copy's .git is stale) or git's HEAD."""
    if os.environ.get("GDN_TVM_COMMIT"):
        return os.environ["GDN_TVM_COMMIT"]
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()


def portable_arg(arg: str) -> str:
    """A command-line argument as the JSON records it: absolute paths (the GPU machine's output folder) by name."""
    return Path(arg).name if Path(arg).is_absolute() else arg


class Results:
    """`Results(path, module, argv, **header)`; `add(row)` appends and rewrites, `save()` rewrites (a row added
    grew); `finish()` marks it complete."""

    def __init__(self, path: str, module: str, argv: list[str] | None, **header):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.time()
        args = argv if argv is not None else sys.argv[1:]
        self.data = {
            "gpu": torch.cuda.get_device_name(),
            "commit": commit(),
            "command": f"python -m {module} " + " ".join(portable_arg(a) for a in args),
            **header,
            "complete": False,
            "rows": [],
        }

    def add(self, row: dict) -> None:
        self.data["rows"].append(row)
        self._write()

    def save(self) -> None:
        """Rewrite the file: a row already added has grown."""
        self._write()

    def finish(self) -> None:
        self.data["complete"] = True
        self._write()
        print(f"wrote {self.path}")

    def _write(self) -> None:
        self.data["seconds"] = round(time.time() - self.t0, 1)
        self.path.write_text(json.dumps(self.data, separators=(",", ":")))  # compact: results travel to the GPU
