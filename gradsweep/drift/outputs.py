"""Write a drift run's outputs into one directory: the JSON report, the rendered table, the PNG plot, and the
signed evidence over all of them (``drift.json``, ``drift.table.txt``, ``drift.png``, ``drift.evidence.json``)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from gradsweep.drift.evidence import sign_drift
from gradsweep.drift.report import render, to_json
from gradsweep.evidence.envelope import write_atomic


def table_text(report: dict) -> str:
    buf = io.StringIO()
    render(report, Console(file=buf, width=200, highlight=False, color_system=None, soft_wrap=True))
    return buf.getvalue()


def write_outputs(report: dict, out_dir: Path, key: Path | None = None, sign: bool = True,
                  say: Callable[[str], None] = lambda s: None) -> dict[str, Path]:
    """Write every output; the plot is skipped (and said so in the report) when matplotlib is missing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    png = out_dir / "drift.png"
    try:
        from gradsweep.drift.plot import plot_report

        written["plot"] = plot_report(report, png)
        report["plot"] = {"file": png.name}
    except ImportError as exc:
        report["plot"] = {"file": None, "reason": f"matplotlib is not installed ({exc}); pip install matplotlib"}
        say(report["plot"]["reason"])
    written["json"] = out_dir / "drift.json"
    write_atomic(written["json"], to_json(report).encode())
    written["table"] = out_dir / "drift.table.txt"
    write_atomic(written["table"], table_text(report).encode())
    if sign:
        written["evidence"] = sign_drift(report, out_dir, [p for k, p in written.items() if k != "evidence"], key,
                                         say)
    return written
