"""The coloured terminal matrix (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gradsweep.evidence.predicate import Predicate
from gradsweep.report.grid import build_grid, problems, tally_text
from gradsweep.report.labels import LEGEND, detail, label


def matrix_table(pred: Predicate) -> Table:
    grid = build_grid(pred)
    table = Table(title=f"gradsweep matrix: {pred.manifest.name}", show_lines=False)
    table.add_column("op")
    table.add_column("layout")
    for profile in grid.profiles:
        table.add_column(profile, justify="center")
    for op, layout in grid.rows:
        row: list[Text] = [Text(op), Text(layout)]
        for profile in grid.profiles:
            rec = grid.at(op, layout, profile)
            row.append(Text("·", style="dim") if rec is None else Text(*label(rec)))
        table.add_row(*row)
    return table


def render_report(pred: Predicate, console: Console, max_problems: int = 40, banners: Sequence[str] = (),
                  note: str | None = None) -> None:
    """Banners (UNVERIFIED, non-default code), matrix, legend, the cells that need a look, stale tracked
    entries, tally and verdict; banners are repeated at the end so neither end of the output hides them."""
    for banner in banners:
        console.print(Text(banner, style="bold white on red"))
    if note:
        console.print(Text(note, style="dim"))
    console.print(matrix_table(pred))
    console.print(Text(LEGEND, style="dim"))
    listed = [r for r in problems(pred) if not r.result.status.is_blocked]
    blocked: dict[tuple[str, str], list[str]] = {}
    for rec in problems(pred):
        if rec.result.status.is_blocked:
            blocked.setdefault((label(rec)[0], rec.result.reason), []).append(rec.result.key.id)
    for (text, reason), ids in blocked.items():
        more = ", ..." if len(ids) > 1 else ""
        console.print(Text(f"{text}: {len(ids)} cell(s) ({ids[0]}{more}): {reason}", style="dim"))
    if listed:
        console.print(Text("Not green:", style="bold"))
        for rec in listed[:max_problems]:
            text, style = label(rec)
            console.print(Text.assemble("  ", (f"{text:<12}", style), f" {rec.result.key.id}: {detail(rec)}"))
        if len(listed) > max_problems:
            console.print(f"  ... and {len(listed) - max_problems} more (gradsweep report --format md)")
    for entry in pred.stale_tracked:
        where = pred.tracked_file or "the tracked-reds file"
        console.print(Text(f"STALE tracked entry {entry.cell}: its cells are green now; remove it from "
                           f"{where} (fix: {entry.fix})", style="yellow"))
    style = "bold green" if pred.verdict.exit_code == 0 else "bold red"
    console.print(Group(Text(tally_text(pred)), Text(pred.verdict.summary, style=style)))
    for banner in banners:
        console.print(Text(banner, style="bold white on red"))
