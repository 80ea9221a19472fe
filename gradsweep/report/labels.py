"""How one cell's status is shown: a short label, a rich style, a markdown glyph."""

from __future__ import annotations

from gradsweep.evidence.predicate import CellRecord
from gradsweep.results import Status

_LABEL = {
    Status.GREEN: ("green", "bold green", "✅"),
    Status.RED_VERDICT: ("red", "bold red", "❌"),
    Status.RED_NO_BACKWARD: ("no-bwd", "bold red", "❌"),
    Status.BLOCKED_HARDWARE: ("blk-hw", "dim", "⛔"),
    Status.BLOCKED_C2: ("blk-c2", "magenta", "⛔"),
    Status.SKIPPED: ("skip", "dim", "⏭️"),
    Status.ERROR: ("ERROR", "bold white on red", "💥"),
}

LEGEND = ("green: invariant and accurate | red: a verdict failed | no-bwd: no gradient path | "
          "blk-hw: hardware absent | blk-c2: candidate not declared/missing | skip: optional | "
          "ERROR: crashed/timed out | (t) tracked red | (U) UNTRACKED red")


def label(rec: CellRecord) -> tuple[str, str]:
    """(text, rich style); reds carry (t) when tracked, (U) when untracked."""
    text, style, _ = _LABEL[rec.result.status]
    if rec.result.status.is_red:
        if rec.tracked is not None:
            return f"{text} (t)", "yellow"
        return f"{text.upper()} (U)", "bold red"
    return text, style


def glyph(rec: CellRecord) -> str:
    """Markdown cell text."""
    text, _, mark = _LABEL[rec.result.status]
    if rec.result.status.is_red:
        return f"🟡 {text} (t)" if rec.tracked is not None else f"{mark} **{text.upper()} (U)**"
    return f"{mark} {text}"


def detail(rec: CellRecord) -> str:
    """One line on why a cell is not green."""
    res = rec.result
    first, reason = res.first_failure or "", res.reason or ""
    if first and first in reason:  # the reason already opens with the first failure: say it once
        text = reason
    else:
        text = "; ".join(p for p in (first, reason if reason not in first else "") if p)
    if rec.tracked is not None:
        text += f" [tracked: {rec.tracked.reason}; fix: {rec.tracked.fix}]"
    return text
