"""The tally of a sweep and the verdict (exit code) it implies.

Exit codes (sweep, merge, check):
  0  every non-skipped cell green or blocked (and no stale tracked entry under --strict)
  1  an untracked red or an error (or, with --strict, a blocked cell or a stale tracked entry)
  2  bad usage, manifest or input (raised before anything runs; not decided here)
  3  nothing could run: every cell blocked or skipped (or no cell at all)
"""

from __future__ import annotations

from gradsweep.evidence.predicate import CellRecord, Tally, Verdict
from gradsweep.results import CellResult, Status
from gradsweep.tracked_reds import TrackedEntry, match_entry, stale_entries

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
EXIT_NOTHING_RAN = 3


def mark(results: list[CellResult], entries: list[TrackedEntry]) -> list[CellRecord]:
    """Attach the covering tracked entry to each red; sorted by cell id for a stable matrix."""
    ordered = sorted(results, key=lambda r: r.key.id)
    return [CellRecord(result=r, tracked=match_entry(entries, r)) for r in ordered]


def tally(records: list[CellRecord], entries: list[TrackedEntry]) -> tuple[Tally, list[TrackedEntry]]:
    by_status = {s.value: 0 for s in Status}
    for rec in records:
        by_status[rec.result.status.value] += 1
    stale = stale_entries(entries, [r.result for r in records])
    tracked = sum(1 for r in records if r.result.status.is_red and r.tracked is not None)
    untracked = sum(1 for r in records if r.untracked_red)
    return Tally(total=len(records), by_status=by_status, tracked_red=tracked, untracked_red=untracked,
                 stale_tracked=len(stale)), stale


def verdict(t: Tally, strict: bool) -> Verdict:
    """Decide the exit code from the tally (see the module docstring)."""
    s = t.by_status
    errors = s[Status.ERROR.value]
    blocked = s[Status.BLOCKED_HARDWARE.value] + s[Status.BLOCKED_C2.value]
    ran = s[Status.GREEN.value] + t.tracked_red + t.untracked_red + errors
    problems = []
    if t.untracked_red:
        problems.append(f"{t.untracked_red} untracked red")
    if errors:
        problems.append(f"{errors} error")
    if strict and blocked:
        problems.append(f"{blocked} blocked (--strict)")
    if strict and t.stale_tracked:
        problems.append(f"{t.stale_tracked} stale tracked entries (--strict)")
    if t.untracked_red or errors:
        return Verdict(exit_code=EXIT_FAIL, summary="FAIL: " + ", ".join(problems), strict=strict)
    if ran == 0:
        return Verdict(exit_code=EXIT_NOTHING_RAN, strict=strict,
                       summary=f"NOTHING RAN: all {t.total} cells blocked or skipped")
    if problems:
        return Verdict(exit_code=EXIT_FAIL, summary="FAIL: " + ", ".join(problems), strict=strict)
    extra = f", {t.tracked_red} tracked red" if t.tracked_red else ""
    return Verdict(exit_code=EXIT_OK, strict=strict,
                   summary=f"PASS: {s[Status.GREEN.value]} green{extra}, {blocked} blocked, "
                           f"{s[Status.SKIPPED.value]} skipped")
