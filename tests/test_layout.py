"""The package layout: imports run one way between its parts, and every op has its definition, reference and
schedule under one name."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

from gdn_tvm.registry import OPS

# Lower layers first; a part imports only parts of lower layers (and itself). The registry reaches ops, reference
# and schedules by name (`importlib`), which is the one import this test does not see.
LAYERS = (
    ("config", "signature", "target", "philox"),
    ("naming", "plan", "ops", "reference", "schedules"),
    ("registry", "runtime"),
    ("traffic", "verify", "cli"),
    ("codegen",),
    ("tuning",),
    ("export", "generate"),
)
RUNTIME_NEEDS = {"config", "naming", "signature", "plan", "runtime"}  # what a process without the TVM compiler imports
TWINS = ("gdn_tvm/ops", "gdn_tvm/reference", "schedules")
SHARED = {"__init__", "common", "activations", "decode_step", "mma"}  # helpers of a folder's ops (mma: tensor-core
# intrinsics), the whole-step reference


def _part(path: Path) -> str:
    """The part of the package a source file belongs to: its package under gdn_tvm, or its module."""
    rel = path.relative_to(REPO).with_suffix("").parts
    return "schedules" if rel[0] == "schedules" else rel[1]


def _imported_parts(path: Path) -> set[str]:
    part, found = _part(path), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names = [part] if node.level else [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("gdn_tvm.")}
    return found - {part}


def _sources() -> list[Path]:
    sources = [*(REPO / "gdn_tvm").rglob("*.py"), *(REPO / "schedules").rglob("*.py")]
    return sorted(p for p in sources if p != REPO / "gdn_tvm" / "__init__.py")  # the package docstring


def test_imports_run_one_way():
    rank = {part: i for i, layer in enumerate(LAYERS) for part in layer}
    wrong = []
    for path in _sources():
        part = _part(path)
        assert part in rank, f"{path}: part {part!r} has no layer in LAYERS"
        for imported in _imported_parts(path):
            if rank[imported] >= rank[part]:
                wrong.append(f"{path.relative_to(REPO)} ({part}) imports {imported}")
            if part == "runtime" and imported not in RUNTIME_NEEDS:
                wrong.append(f"{path.relative_to(REPO)}: the runtime imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_every_op_has_its_definition_reference_and_schedule_by_one_name():
    """ops/, reference/ and schedules/ hold the same file names, each an op family of the registry."""
    families = {op.family for op in OPS.values()}
    for folder in TWINS:
        found = {p.stem for p in (REPO / folder).glob("*.py")} - SHARED
        assert found == families, (
            f"{folder}: {sorted(found - families)} are no op family, {sorted(families - found)} missing"
        )
