"""A PNG of a drift report: per boundary, how far each pair's roles differ and how much of the final logp
difference each boundary carries; per layer, how the residual stream's drift grows.

matplotlib is imported here only (the Agg backend: no display), so a box without it still gets the table and
the JSON; the file's bytes carry no timestamp, so the same report draws the same PNG.
"""

from __future__ import annotations

from pathlib import Path

LINTHRESH = 1e-9  # values below it are drawn on the linear part of the axis: 0 is "bitwise equal"


def _f(x) -> float:
    """A report number (a JSON round trip spells inf as "Infinity"); None is drawn as 0."""
    return 0.0 if x is None else float(x)


def plot_report(report: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = [p for p in report["pairs"] if p["status"] == "compared"]
    names = [b["name"] for b in report["boundaries"]]
    x = list(range(len(names)))
    fig, axes = plt.subplots(3, 1, figsize=(max(10.0, 0.32 * len(names)), 12.0), constrained_layout=True)
    top, mid, low = axes
    for p in pairs:
        by = {e["name"]: e for e in p["boundaries"]}
        label = f"{p['id']} [{p['claim']}]"
        top.plot(x, [_f(by[n]["max_abs"]) for n in names], marker="o", ms=3, label=label)
        mid.plot(x[:-1], [_f((by[n].get("dlogp") or {}).get("mean_abs")) for n in names[:-1]], marker="s",
                 ms=3, label=label)
        layers = p["layers"]
        stream = [_f(by["embedding"]["mean_abs"])] + [_f(row["residual_mean_abs"]) for row in layers]
        peak = [_f(by["embedding"]["max_abs"])] + [_f(row["residual_max_abs"]) for row in layers]
        ticks = list(range(len(stream)))
        low.plot(ticks, peak, marker="^", label=f"{label} max")
        low.plot(ticks, stream, marker="v", linestyle="--", label=f"{label} mean")
    for ax, title in ((top, "max |infer - train| per boundary (0: bitwise equal)"),
                      (mid, "mean |dlogp| on loss-carrying tokens when the train role takes this boundary's "
                            "inference tensor")):
        ax.set_xticks(x, names, rotation=90, fontsize=7)
        ax.set_yscale("symlog", linthresh=LINTHRESH)
        ax.set_ylim(bottom=0.0)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    layers_n = report["shape"]["layers"]
    low.set_xticks(list(range(layers_n + 1)), ["embedding"] + [f"L{i}.residual" for i in range(layers_n)])
    low.set_yscale("symlog", linthresh=LINTHRESH)
    low.set_ylim(bottom=0.0)
    low.set_title("residual stream drift by layer", fontsize=10)
    low.grid(True, alpha=0.3)
    for ax in axes:
        if pairs:
            ax.legend(fontsize=7)
    fig.suptitle(f"gradsweep drift: {report['manifest']['name']}, {report['samples']['tokens']} tokens, "
                 f"hidden {report['shape']['hidden']} x {layers_n} layers, {report['device']}", fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
