"""Status transitions between two evidence files, regressions first.

A regression is a cell that is now red or error and was not (or was tracked and is now
untracked); lost coverage is green turning blocked/skipped/absent; fixed is red/error turning green.
"""

from __future__ import annotations

from dataclasses import dataclass

from gradsweep.evidence.predicate import CellRecord, Predicate

ABSENT = "absent"
KINDS = ("regression", "lost coverage", "fixed", "new", "changed")


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


def _kind(old: CellRecord | None, new: CellRecord | None) -> str:
    if _bad(new) and not _bad(old):
        return "regression"
    if new is not None and new.result.status.is_red and (old is None or old.result.status.value == "green"):
        return "regression"
    was_green = old is not None and old.result.status.value == "green"
    if was_green and (new is None or new.result.status.value != "green"):
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
    return "\n".join(lines)
