"""scripts/fold_ab_verdict.py (the gate that lets a CUDA fold patch into a signing call): it must refuse a candidate
whose GPU tests did not pass, one that is not GAIN faster, and an A/B it cannot read; and prove one that is. Checked
on reports printed by fold_io_probe.py's own report_lines (what the device writes), so a change to that format
that the verdict cannot read fails here, not in a signing call."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.fold_ab_verdict import fold_ratios, verdict
from scripts.fold_io_probe import report_lines

PASSED = "....\n58 passed, 28 deselected, 1 warning in 27.54s\n"
FAILED = "..F.\n1 failed, 57 passed, 28 deselected in 27.54s\n"


def probe(r4096: float, r16384: float) -> str:
    """One fold_io_probe.py --plain output (its own report_lines) whose production fold reads the given ratios to
    cuBLAS bf16."""
    def result(t: int, tiles: int, ratio: float) -> dict:
        cub = 200.0 * t / 4096
        us = {"default": cub * ratio, "cublas": cub, "triton": cub * 1.3}
        return {"T": t, "tiles": tiles, "bits": {"default": True}, "us": us,
                "spread": {k: (v * 0.99, v * 1.05) for k, v in us.items()}}

    return "NVIDIA H100 80GB HBM3 SMs 132\n" + "\n".join(
        report_lines([result(4096, 70, r4096), result(16384, 262, r16384)])) + "\n"


def write_ab(out: Path, ref: list[float], cand: list[float], tests: str = PASSED) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gputest.txt").write_text(tests)
    for i, (a, b) in enumerate(zip(ref, cand), 1):
        (out / f"ref{i}.txt").write_text(probe(a, 1.08))
        (out / f"cand{i}.txt").write_text(probe(b, 1.08))
    return out


def test_the_probe_output_is_read_per_case() -> None:
    assert fold_ratios(probe(1.335, 1.076)) == {4096: 1.335, 16384: 1.076}


@pytest.mark.parametrize(("ref", "cand", "tests", "rc"), [
    ([1.335, 1.326, 1.343], [1.25, 1.26, 1.27], PASSED, 0),    # 5.5% faster, tests passed: proven
    ([1.335, 1.326, 1.343], [1.310, 1.304, 1.335], PASSED, 1),  # this session's -1.4%: not proven
    ([1.335, 1.326, 1.343], [1.25, 1.26, 1.27], FAILED, 1),     # faster, but a test failed: not proven
    ([1.335, 1.326, 1.343], [1.40, 1.41, 1.42], PASSED, 1),     # slower
])
def test_the_verdict(tmp_path: Path, ref: list[float], cand: list[float], tests: str, rc: int) -> None:
    got, text = verdict(write_ab(tmp_path / "ab", ref, cand, tests), 0.03, 4096)
    assert got == rc, text
    assert text.splitlines()[-1].startswith("PROVEN:" if rc == 0 else "NOT PROVEN:"), text


def test_an_unreadable_ab_is_not_proven(tmp_path: Path) -> None:
    out = write_ab(tmp_path / "ab", [1.3], [1.2])
    (out / "cand1.txt").write_text("Traceback (most recent call last):\nRuntimeError: CUDA error\n")
    assert verdict(out, 0.03, 4096)[0] == 2
    assert verdict(tmp_path / "missing", 0.03, 4096)[0] == 2
