"""The matrix as a grid: rows (op, layout), columns profiles, independent of how it is drawn."""

from __future__ import annotations

from dataclasses import dataclass

from gradsweep.evidence.predicate import CellRecord, Predicate


@dataclass(frozen=True)
class Grid:
    profiles: list[str]
    rows: list[tuple[str, str]]
    cells: dict[tuple[str, str, str], CellRecord]

    def at(self, op: str, layout: str, profile: str) -> CellRecord | None:
        return self.cells.get((op, layout, profile))


def build_grid(pred: Predicate) -> Grid:
    profiles: list[str] = []
    rows: list[tuple[str, str]] = []
    cells: dict[tuple[str, str, str], CellRecord] = {}
    for rec in pred.cells:
        key = rec.result.key
        if key.profile not in profiles:
            profiles.append(key.profile)
        if (key.op, key.layout) not in rows:
            rows.append((key.op, key.layout))
        cells[(key.op, key.layout, key.profile)] = rec
    return Grid(profiles=sorted(profiles), rows=sorted(rows), cells=cells)


def problems(pred: Predicate) -> list[CellRecord]:
    """Cells worth a line of explanation: untracked reds and errors first, then tracked reds, then blocked."""
    def rank(rec: CellRecord) -> int:
        status = rec.result.status
        if rec.untracked_red or status.value == "error":
            return 0
        if status.is_red:
            return 1
        return 2
    chosen = [r for r in pred.cells if r.result.status.value not in ("green", "skipped")]
    return sorted(chosen, key=lambda r: (rank(r), r.result.key.id))


def tally_text(pred: Predicate) -> str:
    t = pred.tally
    shown = ", ".join(f"{k} {v}" for k, v in t.by_status.items() if v)
    return (f"{t.total} cells: {shown or 'none'} | untracked red {t.untracked_red}, "
            f"tracked red {t.tracked_red}, stale tracked entries {t.stale_tracked}")
