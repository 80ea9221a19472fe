"""Tracked reds: marks, the untracked count, stale entries, and the exit-code verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradsweep.errors import BadInput
from gradsweep.evidence.predicate import Tally
from gradsweep.results import CellKey, CellResult, Status
from gradsweep.sweep.tally import mark, tally, verdict
from gradsweep.tracked_reds import TrackedEntry, load_tracked


def _r(cell: str, status: Status) -> CellResult:
    return CellResult(key=CellKey.parse(cell), status=status)


ENTRIES = [TrackedEntry(cell="a/torch/*", reason="stock torch varies", fix="by design"),
           TrackedEntry(cell="b/tri/x", reason="split-K in dW", fix="issue #7"),
           TrackedEntry(cell="c/tri/x", reason="old bug", fix="PR #9")]


def test_marks_tally_and_stale() -> None:
    results = [_r("a/torch/x", Status.RED_VERDICT), _r("a/torch/y", Status.GREEN),
               _r("b/tri/x", Status.RED_NO_BACKWARD), _r("b/tri/y", Status.RED_VERDICT),
               _r("c/tri/x", Status.GREEN), _r("d/tri/x", Status.BLOCKED_HARDWARE)]
    records = mark(results, ENTRIES)
    by_id = {r.result.key.id: r for r in records}
    assert by_id["a/torch/x"].tracked == ENTRIES[0] and not by_id["a/torch/x"].untracked_red
    assert by_id["a/torch/y"].tracked is None and not by_id["a/torch/y"].untracked_red
    assert by_id["b/tri/y"].untracked_red
    counts, stale = tally(records, ENTRIES)
    assert (counts.tracked_red, counts.untracked_red, counts.stale_tracked) == (2, 1, 1)
    assert stale == [ENTRIES[2]]
    assert verdict(counts, strict=False).exit_code == 1
    only_tracked, _ = tally(mark([r for r in results if r.key.id != "b/tri/y"], ENTRIES), ENTRIES)
    assert verdict(only_tracked, strict=False).exit_code == 0
    assert verdict(only_tracked, strict=True).exit_code == 1  # blocked + stale entry under --strict


def test_blocked_cells_never_make_an_entry_stale() -> None:
    records = mark([_r("b/tri/x", Status.BLOCKED_HARDWARE)], ENTRIES)
    assert tally(records, ENTRIES)[1] == []


def _tally(**counts: int) -> Tally:
    by_status = {s.value: counts.get(s.value, 0) for s in Status}
    return Tally(total=sum(by_status.values()), by_status=by_status, tracked_red=counts.get("tracked", 0),
                 untracked_red=counts.get("untracked", 0), stale_tracked=0)


@pytest.mark.parametrize(("counts", "strict", "code"), [
    ({"green": 3}, False, 0),
    ({"green": 3, "blocked_hardware": 2, "skipped": 1}, False, 0),
    ({"green": 3, "blocked_c2": 1}, True, 1),
    ({"green": 1, "error": 1}, False, 1),
    ({"green": 1, "red_verdict": 1, "untracked": 1}, False, 1),
    ({"green": 1, "red_verdict": 1, "tracked": 1}, False, 0),
    ({"blocked_hardware": 4, "skipped": 1}, False, 3),
    ({"blocked_hardware": 4}, True, 3),
    ({}, False, 3),
])
def test_verdict_exit_codes(counts: dict[str, int], strict: bool, code: int) -> None:
    assert verdict(_tally(**counts), strict).exit_code == code


def test_tracked_file_validation(tmp_path: Path) -> None:
    good = tmp_path / "t.yaml"
    good.write_text("version: 1\ntracked:\n  - cell: a/b/c\n    reason: r\n    fix: issue #1\n")
    assert load_tracked(good)[0].cell == "a/b/c"
    for text, match in (("tracked: [ {cell: a/b, reason: r, fix: f} ]", "op/profile/layout"),
                        ("tracked: [ {cell: a/b/c, reason: r} ]", "fix"),
                        ("tracked: [ {cell: a/b/c, reason: r, fix: f, extra: 1} ]", "extra"),
                        ("tracked: [unclosed", "malformed YAML")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(BadInput, match=match):
            load_tracked(bad)


def test_shipped_tracked_file_is_valid() -> None:
    shipped = Path(__file__).resolve().parents[1] / "manifests" / "tracked_reds.yaml"
    if not shipped.exists():
        pytest.skip("manifests/tracked_reds.yaml not present")
    for entry in load_tracked(shipped):
        assert entry.reason and entry.fix
