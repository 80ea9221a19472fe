"""scripts/timeline_probe.py's reading of a trace, on made-up device intervals (no GPU): overlapping activity is
merged before busy time is counted, and each idle gap names the activity that ends it and the one after it."""

from __future__ import annotations

from scripts.timeline_probe import gaps


def test_overlaps_merge_and_gaps_name_their_neighbours() -> None:
    events = [(0.0, 10.0, "a"), (5.0, 12.0, "b"), (20.0, 30.0, "c"), (22.0, 25.0, "c.copy"), (31.0, 40.0, "d")]
    busy, span, found = gaps(events)
    assert busy == 12.0 + 10.0 + 9.0
    assert span == 40.0
    assert found == [(8.0, "b", "c"), (1.0, "c", "d")]


def test_a_busy_device_has_no_gaps() -> None:
    busy, span, found = gaps([(0.0, 4.0, "k1"), (3.0, 9.5, "k2"), (4.0, 9.0, "k3")])  # by start, as device_events gives
    assert (busy, span, found) == (9.5, 9.5, [])
