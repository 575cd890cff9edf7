"""Tables (docs/benchmarks.md) and a roofline-style plot (docs/roofline.png) from the committed benchmark JSON.

python -m benchmarks.report [--results DIR --doc FILE]   (`make bench` renders its own run into build/results/)
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

RESULTS = Path("benchmarks/results")
DOC = Path("docs/benchmarks.md")
PLOT = "roofline.png"  # beside the doc


def _fmt(v, nd=2) -> str:
    return "" if v is None else f"{v:.{nd}f}"


def _partial(data: dict) -> list[str]:
    lines = [f"Left out, superseded: {data['superseded']}.", ""] if "superseded" in data else []
    if data.get("complete", True):
        return lines
    return lines + [
        f"**Partial run** ({data.get('stopped', 'stopped by its time limit')}); "
        f"missing: {data.get('missing', 'the rows after the last')}.",
        "",
    ]


def ops_table(data: dict) -> list[str]:
    lines = [
        f"### Operators — {data['preset']}{_dtypes(data)} on {data['gpu']} (commit {data['commit']})",
        "",
        *_partial(data),
        f"`{data['command']}`; empty kernel (graph-replayed): {data['empty_launch_us']:.2f} us. "
        f"{_compilers(data)}TVM and fla are CUDA-graph replayed, PyTorch {_torch_timing(data)}; "
        "inputs rotate so L2 does not serve them (L2-hot: one input set, as inside a decode step, for ops moving "
        "<= 4 MiB). fla: the state in our "
        f"V-first layout (`state_v_first=True`), written to a new buffer as its wrapper does; fla K-first: its default "
        "layout; fla in place: its kernel updating our V-first state in place, as engines run it (runs before "
        f"2026-12-02 lack it).{_bf16_baselines(data)}"
        f"{_checked(data)}",
        "",
        f"| op | B | TVM us | GB/s | % of {data['peak_gbps'] / 1e3:.1f} TB/s | L2-hot us | tuned us | dlight us "
        "| torch us | fla us | fla GB/s | fla K-first us | fla in place us |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['op']} | {r['batch']} | {_fmt(r['tvm_us'])} | {_fmt(r['tvm_gbps'], 0)} "
            f"| {_fmt(r['tvm_pct_peak'], 1)} | {_fmt(r.get('tvm_hot_us'))} | {_baseline(r, 'tuned')} "
            f"| {_baseline(r, 'dlight')} | {_baseline(r, 'torch')} | {_baseline(r, 'fla')} "
            f"| {_fmt(r.get('fla_gbps'), 0)} | {_baseline(r, 'fla_kfirst')} | {_baseline(r, 'fla_inplace')} |"
        )
    return lines


def _torch_timing(data: dict) -> str:
    """How the run timed PyTorch: graph-replayed from 42e30ea (`baseline_timing`), eagerly before (host-bound below
    ~20 us a call)."""
    if data.get("baseline_timing") == "cuda-graph":
        return "too"
    return "eagerly (its host overhead, ~20 us a call, bounds the small ops)"


def _dtypes(data: dict) -> str:
    """The run's storage dtypes where one is not float32 (", weight bfloat16, kv bfloat16, state float32"); "" for
    float32 runs and for older results, which do not record them."""
    stored = data.get("dtypes", {})
    if all(dtype == "float32" for dtype in stored.values()):
        return ""
    return "".join(f", {field.removesuffix('_dtype')} {dtype}" for field, dtype in stored.items())


def _bf16_baselines(data: dict) -> str:
    """The sentence on PyTorch's bf16 activations, for runs whose GEMV weights or KV cache are bf16."""
    stored = data.get("dtypes", {})
    if "bfloat16" not in (stored.get("weight_dtype"), stored.get("kv_dtype")):
        return ""
    return (
        " PyTorch runs its GEMVs on bf16 weights and its attention on a bf16 cache with bf16 activations, as engines "
        "do (cuBLAS bf16, bf16 SDPA), checked within 1e-2 (`torch_ops.BF16_ACTIVATIONS_TOL`)."
    )


def _checked(data: dict) -> str:
    """The sentence on baseline checks, for runs that made them (their rows hold `torch_rel_err`, ...)."""
    if not any(k.endswith("_rel_err") and k.startswith(("torch", "fla")) for r in data["rows"] for k in r):
        return ""
    return (
        " Every kernel and baseline was checked against the float64 reference first: a baseline that did not match "
        "was not timed (wrong), one that raised is marked failed."
    )


def _baseline(row: dict, label: str, us: str | None = None) -> str:
    """A column's microseconds (`us`, default `<label>_us`); "wrong" where it did not match the reference, "failed"
    where it raised."""
    error = row.get(f"{label}_error")
    if error is not None:
        return "wrong" if error.startswith("wrong") else "failed"
    return _fmt(row.get(us or f"{label}_us"))


def _compilers(data: dict) -> str:
    """The sentence naming the kernels' CUDA compilers; "" for older results, which do not record them."""
    names = sorted({c for by_batch in data.get("compilers", {}).values() for c in by_batch.values()})
    return f"Kernels compiled by {', '.join(names)}. " if names else ""


def steps_table(data: dict) -> list[str]:
    lines = [
        f"### Decode steps{_dtypes(data)} — {data['gpu']} (commit {data['commit']}), position {data['position']}",
        "",
        *_partial(data),
        f"`{data['command']}`{_step_baseline(data)}",
        "",
        "| what | preset | B | schedules | layers | eager us | graph us | torch eager us | torch graph us "
        "| weight floor us | bytes floor us | graph/eager | graph/floor | graph/bytes floor |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        schedules = r.get("schedules", "hand") + (f" ({r['compiler']})" if "compiler" in r else "")
        lines.append(
            f"| {r['what']} | {r['preset']} | {r['batch']} | {schedules} | {r['layers']} "
            f"| {r['eager_us']} | {r['graph_us']} "
            f"| {_baseline(r, 'torch', 'torch_eager_us')} "
            f"| {_baseline(r, 'torch' if 'torch_error' in r else 'torch_graph')} "
            f"| {r['weight_floor_us']} | {_fmt(r.get('bytes_floor_us'))} "
            f"| {r['graph_speedup_vs_eager']}x | {r['graph_vs_floor']}x "
            f"| {_fmt(r.get('graph_vs_bytes_floor'))}{'x' if 'graph_vs_bytes_floor' in r else ''} |"
        )
    return lines + breakdown_table(data)


def _step_baseline(data: dict) -> str:
    """The sentence on the PyTorch step, for runs that checked it against ours (they record the tolerance)."""
    if "baseline_tol" not in data:
        return ""
    return (
        f". The PyTorch step was checked against ours from the same states and caches first (relative L-inf within "
        f"{data['baseline_tol']:g}: it multiplies in bf16), then timed eagerly and graph-replayed."
    )


def breakdown_table(data: dict) -> list[str]:
    """Per-kernel microseconds of each layer row that has them (each kernel graph-replayed alone)."""
    rows = [r for r in data["rows"] if r.get("kernels")]
    if not rows:
        return []
    lines = ["", "Each launch of a layer's plan timed alone (graph-replayed, L2-hot), microseconds:", ""]
    for r in rows:
        total = sum(k["us"] for k in r["kernels"])
        lines.append(f"- {r['what']}, {r['preset']}, B={r['batch']} (sum {total:.1f} us, graph {r['graph_us']} us): "
                     + ", ".join(f"{k['kernel']} {k['us']}" for k in r["kernels"]))  # fmt: skip
    return lines


def plot(data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for batch, dtypes in sorted({(r["batch"], r.get("dtypes", "")) for r in data["rows"]}):
        rows = [r for r in data["rows"] if (r["batch"], r.get("dtypes", "")) == (batch, dtypes)]
        ax.scatter([r["bytes"] for r in rows], [r["tvm_gbps"] for r in rows], label=f"B={batch}{dtypes}", s=18)
    ax.axhline(data["peak_gbps"], color="k", ls="--", lw=1, label=f"{data['peak_gbps'] / 1e3:.1f} TB/s copy peak")
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per launch")
    ax.set_ylabel("achieved GB/s")
    ax.set_title(f"gdn_tvm hand schedules, {data['preset']}, {data['gpu']}")
    ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency

    # A 256-colour palette: the plot's few hundred antialiased colours in a third of the RGBA file's bytes (the
    # repo travels to the GPU machine in a 64 MiB call beside the TVM stack).
    Image.open(png).convert("RGB").quantize(colors=256).save(path, optimize=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.report", description=__doc__)
    p.add_argument("--results", type=Path, default=RESULTS, help="folder of the runs' JSON (*ops*.json, *steps*.json)")
    p.add_argument("--doc", type=Path, default=DOC, help=f"the Markdown written; the plot goes beside it ({PLOT})")
    args = p.parse_args(argv)
    out = ["# Benchmarks", "", f"Generated by `python -m benchmarks.report` from `{args.results}/*.json`.", ""]
    runs = [json.loads(f.read_text()) for f in args.results.glob("*ops*.json")]
    runs.sort(key=lambda data: min(r["batch"] for r in data["rows"]))
    for data in runs:
        out += ops_table(data) + [""]
    if runs:
        rows = [r | ({"dtypes": _dtypes(data)} if _dtypes(data) else {}) for data in runs for r in data["rows"]]
        plot({**runs[0], "rows": rows}, args.doc.parent / PLOT)
        out += [f"![achieved bandwidth per op]({PLOT})", ""]
    for steps in sorted(args.results.glob("*steps*.json")):
        out += steps_table(json.loads(steps.read_text())) + [""]
    args.doc.write_text("\n".join(out))
    print(f"wrote {args.doc}")


if __name__ == "__main__":
    main()
