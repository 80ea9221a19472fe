"""Baselines parked in host memory: the release chain's FP64 reference and stock runs (~27 GB) wait on the host
between cells on an 80 GB card, where they left stock torch's decode cell out of memory (evidence/README.md).

Parking must not move a verdict or a figure: every comparison computes on the cells' device, slice by slice, from
the same bits. On this CPU box the device is the host, so these tests force the parking path and check that the
reports are identical to the unparked ones, that the stock error behind every bound is computed once per tensor
and class, and when the policy parks.
"""

from __future__ import annotations

import pytest
import torch

import gradsweep.harness.judge as judge_mod
from gradsweep.harness.compare import normwise_error
from gradsweep.harness.kernel_check import check_kernel

LAYOUTS = ["bn_full", "bn_chunked", "bn_permuted", "decode"]


def _report(op: str, impl: str):
    report = check_kernel(op, impl, layouts=LAYOUTS)
    return {lay: (v.status, v.reason, v.tensors) for lay, v in report.cells.items()}


@pytest.mark.parametrize(("op", "impl"), [("rms_norm", "torch.rms_norm"), ("det_gemm", "torch.det_gemm")])
def test_parked_baselines_give_the_same_report(op: str, impl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = _report(op, impl)
    parked_calls = []

    def park(b, device):
        parked_calls.append(device)
        return judge_mod.park_baselines(b)

    monkeypatch.setattr(judge_mod, "_maybe_park", park)
    parked = _report(op, impl)
    assert parked_calls, "the parking path did not run"
    assert parked == plain  # statuses, reasons and every metric, to the last bit of each float


def test_park_moves_the_reference_and_stock_runs_and_keeps_the_starts() -> None:
    from gradsweep.harness.execute import LayoutRun

    t = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    run = LayoutRun({"y": t.float()}, {"y": "forward"})
    b = judge_mod.OpBaselines({"y": t}, {"w": t.float()}, {"dw": t.float()}, run, run)
    b.stock_errors[("y", "bf16")] = 1.0
    p = judge_mod.park_baselines(b)
    assert p.parked and not b.parked
    assert p.starts is b.starts and p.stock_errors == {}  # the starts stay; nothing computed before is reused
    assert all(x.device.type == "cpu" for x in [*p.reference.values(), *p.stock_bf16.tensors.values()])


def test_the_stock_error_is_computed_once_per_tensor_and_class(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple] = []

    def counting(candidate, reference, start=None, limit=None, device=None):
        seen.append((candidate.data_ptr(), reference.data_ptr()))
        return normwise_error(candidate, reference, start, limit, device)

    monkeypatch.setattr(judge_mod, "normwise_error", counting)
    report = check_kernel("rms_norm", "torch.rms_norm", layouts=LAYOUTS)
    assert len(report.cells) == len(LAYOUTS)
    assert seen, "no stock error was computed"
    assert len(seen) == len(set(seen)), "a stock error was computed twice for the same tensors"


def test_the_policy_parks_what_would_hold_a_quarter_of_the_device() -> None:
    gb = 10**9
    assert judge_mod.should_park(27 * gb, 85 * gb)            # the chain on an 80 GB H100
    assert not judge_mod.should_park(27 * gb, 150 * gb)       # the same on a 141 GB H200
    assert not judge_mod.should_park(10 * gb, 85 * gb)        # a vocabulary-wide op's ~10 GB
    assert judge_mod.should_park(2, 4, fraction=0.25) and not judge_mod.should_park(1, 4, fraction=0.25)


def test_host_baselines_are_never_parked_again() -> None:
    """On the host there is nothing to free: ``_maybe_park`` hands back the same object."""
    from gradsweep.harness.execute import LayoutRun

    run = LayoutRun({}, {})
    b = judge_mod.OpBaselines({}, {}, {}, run, run)
    assert judge_mod._maybe_park(b, torch.device("cpu")) is b


def test_an_explicit_device_gives_the_same_error() -> None:
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(300, 7, dtype=torch.float64, generator=g)
    cand = (ref + 1e-3 * torch.randn(300, 7, dtype=torch.float64, generator=g)).float()
    assert normwise_error(cand, ref, device=torch.device("cpu")) == normwise_error(cand, ref)
