"""Accuracy: candidate vs the FP64 reference, bounded by the contract's ratio rule against stock bf16."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gradsweep.contract import CheckKind, Contract, RatioRule
from gradsweep.harness.compare import normwise_error


@dataclass(frozen=True)
class AccuracyCheck:
    tensor: str
    error: float
    stock_error: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.error <= self.bound


def check_accuracy(contract: Contract, op: str, profile: str, name: str, kind: str, candidate: torch.Tensor,
                   stock: torch.Tensor | None, reference: torch.Tensor) -> AccuracyCheck:
    """error(candidate) <= k * error(stock) + floor, with k and floor from the contract only."""
    check = CheckKind.FORWARD_ACCURACY if kind == "forward" else CheckKind.GRADIENT_ACCURACY
    rule = contract.resolve(check, op, name, str(candidate.dtype).removeprefix("torch."), profile)
    assert isinstance(rule, RatioRule)
    err = normwise_error(candidate, reference)
    stock_err = normwise_error(stock, reference) if stock is not None else 0.0
    return AccuracyCheck(name, err, stock_err, rule.bound(stock_err))
