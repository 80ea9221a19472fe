"""Accuracy: candidate vs the FP64 reference, bounded by the contract's ratio rule against the op's stock path.

The stock error is taken in the tensor's accumulation class: a bf16 output is compared with stock bf16
torch, an output the candidate accumulates in FP32 with stock FP32 math on the same bf16 values. Main
grads start nonzero; their error is measured against this step's contribution (``start``), so a small
increment on a large starting value still shows every error of the fold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradsweep.contract import AccumulationClass, CheckKind, Contract, RatioRule
from gradsweep.harness.compare import normwise_error

BASELINE = "baseline"


@dataclass(frozen=True)
class AccuracyCheck:
    tensor: str
    error: float
    stock_error: float
    bound: float
    accumulation: str

    @property
    def ok(self) -> bool:
        return self.error <= self.bound


def check_accuracy(contract: Contract, op: str, profile: str, name: str, kind: str,
                   accumulation: AccumulationClass, candidate: torch.Tensor, reference: torch.Tensor,
                   start: torch.Tensor | None = None, *, stock_error: float) -> AccuracyCheck:
    """error(candidate) <= k * error(stock, same class) + floor, with k and floor from the contract only.

    ``stock_error``: the stock run's error in the same class (``stock_error_of``; the harness computes it once
    per op). One way in, so a caller cannot hand a stock tensor and a different figure at once."""
    check = CheckKind.FORWARD_ACCURACY if kind == "forward" else CheckKind.GRADIENT_ACCURACY
    rule = contract.resolve(check, op, name, str(candidate.dtype).removeprefix("torch."), profile, accumulation)
    assert isinstance(rule, RatioRule)
    err = normwise_error(candidate, reference, start)
    return AccuracyCheck(name, err, stock_error, rule.bound(stock_error), accumulation)


def stock_error_of(stock: torch.Tensor | None, reference: torch.Tensor, start: torch.Tensor | None = None) -> float:
    """The stock tensor's error against the reference (0.0 where the stock run has no such tensor: the bound is
    then the contract's floor alone)."""
    return normwise_error(stock, reference, start) if stock is not None else 0.0


def baseline_accuracy(name: str, candidate: torch.Tensor, reference: torch.Tensor,
                      start: torch.Tensor | None = None) -> AccuracyCheck:
    """The stock path on the reference layout IS the baseline: its error is reported, never judged against itself."""
    err = normwise_error(candidate, reference, start)
    return AccuracyCheck(name, err, err, float("inf"), BASELINE)
