"""The invariance APIs: one candidate over several layouts, compared bitwise after logical restore.

Accuracy is a separate question (see accuracy.py); nothing here takes a tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gradsweep.contract import BitwiseRule, CheckKind, Contract
from gradsweep.harness.compare import BitwiseDiff, bitwise_compare
from gradsweep.harness.execute import LayoutRun, MissingBackward, run_layout
from gradsweep.layouts import Call
from gradsweep.ops.base import Candidate, OpSpec, Shape
from gradsweep.workload import Workload


@dataclass(frozen=True)
class LayoutConfig:
    """A named physical layout: the calls that bring the logical samples to the operator."""

    name: str
    calls: Sequence[Call]


@dataclass(frozen=True)
class PairResult:
    """One named tensor compared between two configs."""

    tensor: str
    config_a: str
    config_b: str
    diff: BitwiseDiff

    def describe(self) -> str:
        d = self.diff
        return (f"{self.tensor}: {self.config_b} vs {self.config_a}: {d.mismatched} elements differ in bits "
                f"(max abs {d.max_abs:.3g}, max rel {d.max_rel:.3g})")


@dataclass
class InvarianceReport:
    """Per named tensor and config pair: bitwise equality, max abs / max rel; the first failure."""

    op: str
    candidate: str
    kind: str
    pairs: list[PairResult] = field(default_factory=list)
    missing_backward: str | None = None

    @property
    def ok(self) -> bool:
        return self.missing_backward is None and all(p.diff.equal for p in self.pairs)

    @property
    def first_failure(self) -> str | None:
        if self.missing_backward is not None:
            return f"{self.op}: missing backward: {self.missing_backward}"
        bad = next((p for p in self.pairs if not p.diff.equal), None)
        return None if bad is None else f"{self.op}: {bad.describe()}"


class ForwardInvarianceReport(InvarianceReport):
    """Forward outputs compared across layouts."""


class GradientInvarianceReport(InvarianceReport):
    """Every named gradient (inputs and parameters) compared across layouts."""


class InvarianceError(AssertionError):
    def __init__(self, report: InvarianceReport) -> None:
        super().__init__(report.first_failure)
        self.report = report


def compare_runs(base: LayoutRun, other: LayoutRun, kind: str, label_a: str, label_b: str) -> list[PairResult]:
    """Bitwise comparison of every tensor of ``kind`` ('forward' or 'gradient') present in ``base``."""
    out = []
    for name, k in base.kinds.items():
        if k != kind:
            continue
        theirs = other.tensors.get(name)
        diff = (bitwise_compare(base.tensors[name], theirs) if theirs is not None
                else BitwiseDiff(False, base.tensors[name].numel(), float("inf"), float("inf")))
        out.append(PairResult(name, label_a, label_b, diff))
    return out


def _check_contract(contract: Contract, kind: CheckKind, op: OpSpec, profile: str) -> None:
    rule = contract.resolve(kind, op.name, "*", "*", profile)
    if not isinstance(rule, BitwiseRule):  # the resolver guarantees this; refuse anything else loudly
        raise ValueError(f"contract resolves {kind.value} to {rule!r}; invariance must be bitwise")


def _runs(op, candidate, shape, workload, configs, device, backward):
    return [(cfg.name, run_layout(op, candidate, shape, workload, cfg.calls, device, backward=backward))
            for cfg in configs]


def assert_forward_batch_invariant(op: OpSpec, configs: Sequence[LayoutConfig], contract: Contract, *,
                                   candidate: Candidate, workload: Workload, shape: Shape,
                                   device: torch.device | str = "cpu", profile: str = "*",
                                   raise_on_failure: bool = True) -> ForwardInvarianceReport:
    """Forward outputs of every config equal the first config's, bit for bit."""
    _check_contract(contract, CheckKind.FORWARD_INVARIANCE, op, profile)
    report = ForwardInvarianceReport(op.name, candidate.impl_id, "forward")
    runs = _runs(op, candidate, shape, workload, configs, torch.device(device), backward=False)
    (name0, base), rest = runs[0], runs[1:]
    for name, run in rest:
        report.pairs += compare_runs(base, run, "forward", name0, name)
    if raise_on_failure and not report.ok:
        raise InvarianceError(report)
    return report


def assert_gradient_batch_invariant(op: OpSpec, configs: Sequence[LayoutConfig], contract: Contract, *,
                                    candidate: Candidate, workload: Workload, shape: Shape,
                                    device: torch.device | str = "cpu", profile: str = "*",
                                    raise_on_failure: bool = True) -> GradientInvarianceReport:
    """Every named gradient of every config equals the first config's, bit for bit.

    A candidate without a gradient path gives a report with ``missing_backward`` set (never a
    stack trace).
    """
    _check_contract(contract, CheckKind.GRADIENT_INVARIANCE, op, profile)
    report = GradientInvarianceReport(op.name, candidate.impl_id, "gradient")
    try:
        runs = _runs(op, candidate, shape, workload, configs, torch.device(device), backward=True)
    except MissingBackward as exc:
        report.missing_backward = str(exc)
    else:
        (name0, base), rest = runs[0], runs[1:]
        for name, run in rest:
            report.pairs += compare_runs(base, run, "gradient", name0, name)
    if raise_on_failure and not report.ok:
        raise InvarianceError(report)
    return report
