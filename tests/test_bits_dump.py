"""scripts/bits_dump.py's comparison of two builds' dumps: raw bits, so a signed zero or a NaN payload counts,
and a step or tensor missing from one dump is reported (no GPU: the dumps are written here)."""

from __future__ import annotations

import torch

from scripts.bits_dump import compare


def _save(path, steps) -> None:
    torch.save(steps, path)


def test_compare_equal_and_differing_steps(tmp_path) -> None:
    x = torch.tensor([1.0, 0.0, float("nan")])
    a = {"attention/fwd_bwd [cuda]": {"o": x.clone(), "dk": x.clone()}, "only_a [cuda]": {"o": x.clone()}}
    flipped = x.clone()
    flipped[1] = -0.0  # equal as values, not as bits
    b = {"attention/fwd_bwd [cuda]": {"o": x.clone(), "dk": flipped}, "only_b [cuda]": {"o": x.clone()}}
    _save(tmp_path / "a.pt", a)
    _save(tmp_path / "b.pt", b)
    found, same = compare(tmp_path / "a.pt", tmp_path / "b.pt")
    assert not same
    lines = dict(line.split(": ", 1) for line in found)
    assert lines["attention/fwd_bwd [cuda]"].startswith("DIFFERS: dk: 1/3 differ")
    assert lines["only_a [cuda]"] == "only in the first dump"
    assert lines["only_b [cuda]"] == "only in the second dump"
    _save(tmp_path / "c.pt", {"attention/fwd_bwd [cuda]": {"o": x.clone(), "dk": x.clone()}})
    assert compare(tmp_path / "c.pt", tmp_path / "c.pt") == (["attention/fwd_bwd [cuda]: bitwise equal (2 tensors)"],
                                                              True)
