"""Drift of one tensor between two roles: bits first, then the size of the differences.

``mismatched`` counts elements whose raw bits differ (NaN-aware, as the harness compares); the magnitudes are
measured, never judged: max / mean / p99 of |infer - train| over every element, and the same of the relative
difference |infer - train| / max(|infer|, |train|) (0 where both are 0; at most 2), as the harness reports it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from gradsweep.harness.compare import raw_bits


@dataclass(frozen=True)
class TensorDrift:
    mismatched: int
    numel: int
    max_abs: float = 0.0
    mean_abs: float = 0.0
    p99_abs: float = 0.0
    max_rel: float = 0.0
    mean_rel: float = 0.0
    p99_rel: float = 0.0

    @property
    def bitwise_equal(self) -> bool:
        return self.mismatched == 0

    def as_dict(self) -> dict:
        return asdict(self)


def _p99(x: Tensor) -> float:
    """The k-th smallest, k = ceil(0.99 n). On the GPU a sort (CUB radix): kthvalue runs one slice in one block."""
    k = max(1, math.ceil(0.99 * x.numel()))
    if x.is_cuda:
        return float(torch.sort(x).values[k - 1])
    return float(torch.kthvalue(x, k).values)


def tensor_drift(train: Tensor, infer: Tensor, rows: Tensor | None = None) -> TensorDrift:
    """Compare two logical tensors ([tokens, ...]); ``rows`` (bool [tokens]) restricts to some tokens."""
    if train.shape != infer.shape:
        raise ValueError(f"drift: shapes differ, {tuple(train.shape)} vs {tuple(infer.shape)}")
    a, b = train.detach(), infer.detach().to(train.device)
    if b.dtype != a.dtype:  # roles of different families may store a boundary in different dtypes
        b = b.to(a.dtype)
    if rows is not None:
        keep = rows.to(a.device)
        a, b = a[keep], b[keep]
    a, b = a.reshape(-1), b.reshape(-1)
    n = a.numel()
    differ = raw_bits(a) != raw_bits(b)
    if a.is_floating_point():
        differ &= ~(torch.isnan(a) & torch.isnan(b))
    mismatched = int(differ.sum())
    if mismatched == 0 or n == 0:
        return TensorDrift(mismatched, n)
    work = torch.float64 if a.dtype in (torch.float32, torch.float64) else torch.float32
    a, b = a.to(work), b.to(work)
    diff = torch.where(differ, (b - a).abs(), torch.zeros((), dtype=work, device=a.device))  # NaN == NaN: 0
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    scale = torch.maximum(a.abs(), b.abs())
    rel = torch.where(scale > 0, diff / scale, torch.zeros_like(diff))
    rel = torch.where(torch.isinf(diff), torch.full_like(rel, float("inf")), rel)
    return TensorDrift(mismatched, n, float(diff.max()), float(diff.mean()), _p99(diff), float(rel.max()),
                       float(rel.mean()), _p99(rel))


@dataclass(frozen=True)
class LogpEffect:
    """How much the final logp on loss-carrying tokens moves when a boundary takes the other role's tensor."""

    max_abs: float
    mean_abs: float
    share: float | None  # mean_abs / the mean |infer - train| logp difference on those tokens (None if that is 0)

    def as_dict(self) -> dict:
        return asdict(self)


def logp_effect(substituted: Tensor, train: Tensor, total_mean: float, active: Tensor) -> LogpEffect:
    d = (substituted.double() - train.double()).abs()[active.to(train.device)]
    if d.numel() == 0:
        return LogpEffect(0.0, 0.0, None)
    mean = float(d.mean())
    return LogpEffect(float(d.max()), mean, mean / total_mean if total_mean > 0 else None)


def growth(values: list[float]) -> list[float | None]:
    """Each value over the previous one (None where the previous one is 0: nothing to grow from)."""
    out: list[float | None] = [None]
    for prev, cur in itertools.pairwise(values):
        out.append(cur / prev if prev > 0 else None)
    return out
