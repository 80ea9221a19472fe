"""scripts/ab_builds.py's plan (no GPU: the steps are listed, not run): each side's tests and bits dump, every
later side's bits against the first, then the benches in alternation; a side's variant settings ride with it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from scripts.ab_builds import Side, plan


def test_side_parses_name_build_and_variant_settings() -> None:
    side = Side.parse("s4=.devtmp/ab/new:GRADSWEEP_X=4:OTHER=a")
    assert side == Side("s4", Path(".devtmp/ab/new"), {"GRADSWEEP_X": "4", "OTHER": "a"})
    for bad in ("nodir", "=dir", "n=dir:novalue"):
        with pytest.raises(argparse.ArgumentTypeError):
            Side.parse(bad)


def test_plan_orders_tests_bits_then_alternating_benches(tmp_path) -> None:
    a, b = Side("main", Path("old")), Side("new", Path("new"), {"V": "4"})
    steps = plan([a, b], ["attention"], ["cuda"], ["fwd_bwd"], ["tests/test_cuda_attention.py"], 2, tmp_path)
    assert [s.title for s in steps] == [
        "tests [main]", "bits dump [main]", "tests [new]", "bits dump [new]", "bits main vs new",
        "bench [main] round 1", "bench [new] round 1", "bench [main] round 2", "bench [new] round 2"]
    compare = steps[4]
    assert compare.side is None and compare.argv[-2:] == [str(tmp_path / "main.pt"), str(tmp_path / "new.pt")]
    dump = steps[3]
    assert dump.side == b and ["--case", "fwd_bwd"] == dump.argv[-4:-2] and dump.argv[-2:] == ["--family", "cuda"]
    assert all(s.side.env == {"V": "4"} for s in steps if s.side is not None and s.side.name == "new")
