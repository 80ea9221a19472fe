"""The bench as a PNG: per op, each case's headline ratio for every family, with its target drawn.

A case's headline metric is its first target's metric (else end to end against the stock path); bars are
grouped by case, one per family, and a target is a dashed line across its case's group. matplotlib is imported
here only (Agg backend, no display); without it the caller skips the chart with a message. The PNG carries no
timestamp, so the same evidence draws the same bytes.
"""

from __future__ import annotations

import io
from pathlib import Path

from gradsweep.bench.predicate import BenchPredicate, CaseRecord
from gradsweep.evidence.envelope import write_atomic

FAMILY_COLOURS = {"triton": "#1f77b4", "cuda": "#2ca02c"}
HEADLINE_DEFAULT = "e2e_vs_stock"


def headline(case: CaseRecord) -> str:
    """The metric a case is drawn by: its first target's, else end to end against its first reference (host_us
    for host cases)."""
    for fam in case.families.values():
        if fam.targets:
            return fam.targets[0].metric
    if case.runner == "fold_plan":
        return "host_us"
    return f"e2e_vs_{next(iter(case.references))}" if case.references else HEADLINE_DEFAULT


def panels(pred: BenchPredicate) -> dict[tuple[str, str], list[CaseRecord]]:
    """(op, headline metric) -> its cases, in run order: one axis never mixes a ratio with a fraction."""
    out: dict[tuple[str, str], list[CaseRecord]] = {}
    for case in pred.cases:
        out.setdefault((case.op, headline(case)), []).append(case)
    return out


def draw_chart(pred: BenchPredicate, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = panels(pred)
    cols = min(3, max(len(groups), 1))
    rows = max((len(groups) + cols - 1) // cols, 1)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.4 * rows), squeeze=False, constrained_layout=True)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, ((op, metric), cases) in zip(axes.flat, groups.items()):
        families = sorted({f for c in cases for f in c.families})
        width = 0.8 / max(len(families), 1)
        labelled: set[str] = set()
        values: list[float] = []
        for x, case in enumerate(cases):
            for j, fam in enumerate(families):
                res = case.families.get(fam)
                value = res.metrics.get(metric) if res is not None else None
                if value is None or res is None:
                    continue
                pos = x - 0.4 + width * (j + 0.5)
                ax.bar(pos, value, width=width * 0.9, color=FAMILY_COLOURS.get(fam, "#7f7f7f"),
                       label=None if fam in labelled else fam)
                labelled.add(fam)
                values.append(value)
                ax.annotate(f"{value:.2f}", (pos, value), ha="center", va="bottom", fontsize=6)
                for t in res.targets:
                    if t.metric == metric:
                        colour = "#d62728" if t.met is False else "#2ca02c" if t.met else "#7f7f7f"
                        ax.hlines(t.bound, pos - width / 2, pos + width / 2, colors=colour, linestyles="dashed")
                        values.append(t.bound)
        positive = [v for v in values if v > 0]
        if positive and max(positive) / min(positive) > 30:
            ax.set_yscale("log")
        ax.set_xticks(range(len(cases)), [c.name for c in cases], rotation=30, ha="right", fontsize=7)
        ax.set_title(f"{op}: {metric} (dashed: target)", fontsize=9)
        if metric.startswith(("e2e_vs_", "kernels_vs_")):
            ax.axhline(1.0, color="#bbbbbb", linewidth=0.8)
        ax.grid(True, axis="y", alpha=0.3)
        if labelled:
            ax.legend(fontsize=7, loc="upper left")
    run = pred.runs[0]
    gpu = run.provenance.gpu_name or "no GPU"
    flag = "" if pred.claims_figures else " (SMOKE RUN: no figures claimed)"
    fig.suptitle(f"gradsweep bench: {pred.manifest.name} on {gpu}, {run.started_at}{flag}", fontsize=11)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    write_atomic(path, buffer.getvalue())
    return path
