"""scripts/host_probe.py's fold-plan block names the planner that ran and the host's speed around its figures (the
lent host's speed moves ~2x within one device call, notes/triton_rowwise.md, "Twenty-fourth session"). Run here on
CPU tensors with the device drain stubbed (the plan is host work; the staging copies are real CPU copies)."""

from __future__ import annotations

import re

import pytest
import torch

from gradsweep import canonical
from gradsweep.bench.catalog import fold_plan
from scripts import host_probe


@pytest.fixture
def cpu_block(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    quick = fold_plan.cases
    monkeypatch.setattr(fold_plan, "cases", lambda full: quick(True))

    def run() -> list[str]:
        lines: list[str] = []
        host_probe.fold_plan_block(lines.append, torch.device("cpu"), 2, "first")
        return lines
    return run


_CASES = ["packed", "packed_warm", "chunked", "chunked_warm"]
# the CUDA family's fold call: timed where it stages nothing (a packed step plans on the host alone), else not run
# (no CUDA here for its piece copy)
_CUDA = r"fold_plan (\w+) \[cuda\]: (host \d+ us per call, drained \d+ us|not run \(.+\))"


def _check(lines: list[str], planner: str) -> None:
    """Each case in turn: the Triton family's fold call timed (the interpreter runs its piece copy), then the CUDA
    family's line."""
    assert re.fullmatch(rf"fold_plan, first: planner {planner}; Python loop \(200 iterations\) [\d.]+ us",
                        lines[0]), lines
    timed = [re.fullmatch(r"fold_plan (\w+) \[triton\]: host \d+ us per call, drained \d+ us", line)
             for line in lines[1:-1:2]]
    assert all(timed) and [m.group(1) for m in timed] == _CASES, lines
    cuda = [re.fullmatch(_CUDA, line) for line in lines[2:-1:2]]
    assert all(cuda) and [m.group(1) for m in cuda] == _CASES, lines
    assert "not run" in cuda[2].group(2), lines  # a chunked step stages rows: the CUDA piece copy needs CUDA
    assert re.fullmatch(r"fold_plan, first: Python loop after [\d.]+ us", lines[-1]), lines


def test_the_block_names_the_numpy_planner_when_it_ran(cpu_block, monkeypatch):
    monkeypatch.setattr(canonical, "_native_plan", None)
    _check(cpu_block(), "numpy")


@pytest.mark.skipif(canonical._native_plan is None, reason="gradsweep._fold_plan was not built on this box")
def test_the_block_names_the_compiled_planner_when_it_ran(cpu_block):
    _check(cpu_block(), r"compiled \(gradsweep\._fold_plan\)")


def test_the_audit_reports_each_case_its_allocator_events_syncs_and_profile(cpu_block, monkeypatch):
    """`--fold-plan-audit` (run on the GPU host by `h200_closeout.sh --host-audit`): the block's planner and host-speed
    lines around one line per case with its allocator events, then its syncs and its profile, which names the
    planner's entry point (here with the CUDA allocator counters stubbed out)."""
    monkeypatch.setattr(host_probe, "_alloc_counts", lambda: {"num_host_alloc": 0, "num_device_alloc": 0})
    monkeypatch.setattr(host_probe, "_sync_sites", lambda step: ["1x planted sync <- canonical.py:1 take_tiles"])
    lines: list[str] = []
    host_probe.fold_plan_block(lines.append, torch.device("cpu"), 2, "audit", audit_top=10)
    assert re.fullmatch(r"fold_plan, audit: planner .+; Python loop \(200 iterations\) [\d.]+ us", lines[0]), lines
    assert re.fullmatch(r"fold_plan, audit: Python loop after [\d.]+ us", lines[-1]), lines
    audit = r"fold_plan (\w+) \[(triton|cuda)\]: host \d+ us per call, drained \d+ us; allocator events per step none"
    heads = [(i, re.fullmatch(audit, line)) for i, line in enumerate(lines) if line.startswith("fold_plan ")]
    triton = [(i, m) for i, m in heads if m and m.group(2) == "triton"]
    assert [m.group(1) for _, m in triton] == _CASES, lines  # each followed by its sync and its profile
    assert all(lines[i + 1] == "    sync: 1x planted sync <- canonical.py:1 take_tiles" for i, _ in triton), lines
    assert all("take_tiles" in lines[i + 2] for i, _ in triton), lines
    cuda = [re.fullmatch(rf"{audit}|{_CUDA}", lines[i]) for i, m in heads if not m or m.group(2) == "cuda"]
    assert len(cuda) == len(_CASES) and all(cuda), lines
