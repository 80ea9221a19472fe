"""The matrix as GitHub-flavoured markdown, fit for $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

from collections.abc import Sequence

from gradsweep.evidence.predicate import Predicate
from gradsweep.report.grid import build_grid, problems, tally_text
from gradsweep.report.labels import detail, glyph


def _esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(pred: Predicate, banners: Sequence[str] = (), note: str | None = None) -> str:
    grid = build_grid(pred)
    run = pred.runs[0].provenance if pred.runs else None
    where = f"{run.gpu_name or 'no GPU'} ({run.sm or 'no CUDA'}), torch {run.torch}" if run else "unknown"
    icon = "✅" if pred.verdict.exit_code == 0 else "❌"
    out = [f"## gradsweep: {pred.manifest.name} {icon}", "",
           *[f"> **⚠️ {_esc(b)}**\n" for b in banners],
           *([f"_{_esc(note)}_", ""] if note else []),
           f"**{_esc(pred.verdict.summary)}** (exit {pred.verdict.exit_code})", "",
           f"{_esc(tally_text(pred))}", "",
           f"Source `{pred.source.sha256[:16]}`, contract {pred.contract.version}, "
           f"manifest v{pred.manifest.version}, ran on {_esc(where)}.", ""]
    out.append("| op | layout | " + " | ".join(grid.profiles) + " |")
    out.append("|---|---|" + "---|" * len(grid.profiles))
    for op, layout in grid.rows:
        cols = [glyph(rec) if (rec := grid.at(op, layout, p)) else "·" for p in grid.profiles]
        out.append(f"| {op} | {layout} | " + " | ".join(cols) + " |")
    listed = problems(pred)
    if listed:
        out += ["", "<details><summary>Cells that are not green</summary>", "",
                "| cell | status | detail |", "|---|---|---|"]
        out += [f"| `{r.result.key.id}` | {glyph(r)} | {_esc(detail(r))} |" for r in listed]
        out += ["", "</details>"]
    if pred.stale_tracked:
        out += ["", "**Stale tracked entries** (their cells are green now; remove them):", ""]
        out += [f"- `{e.cell}`: {_esc(e.reason)} (fix: {_esc(e.fix)})" for e in pred.stale_tracked]
    return "\n".join(out) + "\n"
