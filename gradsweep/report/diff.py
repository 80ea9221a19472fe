"""Status transitions between two evidence files, regressions first.

A regression is a cell that is now red or error and was not (or was tracked and is now untracked);
lost coverage is a cell that ran (green or red) and now does not (blocked, skipped, or gone); fixed is
red/error turning green. Regressions and lost coverage fail ``gradsweep diff``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradsweep.evidence.predicate import CellRecord, Predicate

ABSENT = "absent"
KINDS = ("regression", "lost coverage", "fixed", "new", "changed")
FAILING = ("regression", "lost coverage")


@dataclass(frozen=True)
class Transition:
    cell: str
    old: str
    new: str
    kind: str
    detail: str = ""


def _state(rec: CellRecord | None) -> str:
    if rec is None:
        return ABSENT
    status = rec.result.status.value
    if rec.result.status.is_red:
        return f"{status} ({'tracked' if rec.tracked else 'UNTRACKED'})"
    return status


def _bad(rec: CellRecord | None) -> bool:
    return rec is not None and (rec.untracked_red or rec.result.status.value == "error")


def _red(rec: CellRecord | None) -> bool:
    return rec is not None and (rec.result.status.is_red or rec.result.status.value == "error")


def _ran(rec: CellRecord | None) -> bool:
    return rec is not None and (rec.result.status.value == "green" or rec.result.status.is_red)


def _kind(old: CellRecord | None, new: CellRecord | None) -> str:
    if _bad(new) and not _bad(old):
        return "regression"
    if _red(new) and not _red(old):
        return "regression"
    if _ran(old) and not _ran(new) and not _red(new):
        return "lost coverage"
    if new is not None and new.result.status.value == "green" and old is not None:
        return "fixed"
    if old is None:
        return "new"
    return "changed"


def diff_predicates(old: Predicate, new: Predicate) -> list[Transition]:
    """Every cell whose state differs, ordered by kind (regressions first) then cell id."""
    before = {r.result.key.id: r for r in old.cells}
    after = {r.result.key.id: r for r in new.cells}
    found = []
    for cell in sorted(set(before) | set(after)):
        o, n = before.get(cell), after.get(cell)
        if _state(o) == _state(n):
            continue
        why = n.result.first_failure or n.result.reason if n is not None else ""
        found.append(Transition(cell=cell, old=_state(o), new=_state(n), kind=_kind(o, n), detail=why or ""))
    return sorted(found, key=lambda t: (KINDS.index(t.kind), t.cell))


def failing(transitions: list[Transition]) -> list[Transition]:
    """The transitions that fail a diff: regressions and lost coverage."""
    return [t for t in transitions if t.kind in FAILING]


def render_diff(transitions: list[Transition]) -> str:
    if not transitions:
        return "no status changes"
    lines = []
    for kind in KINDS:
        group = [t for t in transitions if t.kind == kind]
        if group:
            lines.append(f"{kind.upper()} ({len(group)}):")
            lines += [f"  {t.cell}: {t.old} -> {t.new}" + (f"  [{t.detail}]" if t.detail else "")
                      for t in group]
    regressions = sum(1 for t in transitions if t.kind == "regression")
    lost = sum(1 for t in transitions if t.kind == "lost coverage")
    lines.append(f"FAIL: {regressions} regression(s), {lost} cell(s) of lost coverage" if regressions or lost
                 else "OK: no regression, no lost coverage")
    return "\n".join(lines)
