"""Comparisons: bitwise (raw bits, NaN-aware) for invariance, normwise error for accuracy."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT_VIEW = {2: torch.int16, 4: torch.int32, 8: torch.int64, 1: torch.int8}


@dataclass(frozen=True)
class BitwiseDiff:
    """Raw-bit comparison of two tensors of the same dtype and shape."""

    equal: bool
    mismatched: int
    max_abs: float
    max_rel: float


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (floats are never compared by value)."""
    if not t.is_floating_point():
        return t
    return t.contiguous().view(_INT_VIEW[t.element_size()])


def bitwise_compare(a: torch.Tensor, b: torch.Tensor) -> BitwiseDiff:
    """Equal iff every element has identical bits, or both are NaN (any payload)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return BitwiseDiff(False, max(a.numel(), b.numel()), float("inf"), float("inf"))
    a, b = a.detach(), b.detach().to(a.device)  # compared where they live: no host copy of big grads
    differ = raw_bits(a) != raw_bits(b)
    if a.is_floating_point():
        differ &= ~(torch.isnan(a) & torch.isnan(b))
    n = int(differ.sum())
    if n == 0:
        return BitwiseDiff(True, 0, 0.0, 0.0)
    ad, bd = a[differ].double(), b[differ].double()
    diff = (ad - bd).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
    # relative to the larger magnitude of the pair: meaningful where one side is 0 (at most 2 then)
    scale = torch.maximum(ad.abs(), bd.abs())
    rel = torch.where(scale > 0, diff / scale, torch.zeros_like(diff))
    rel = torch.where(torch.isinf(diff), torch.full_like(rel, float("inf")), rel)
    return BitwiseDiff(False, n, float(diff.max()), float(rel.max()))


def normwise_error(candidate: torch.Tensor, reference: torch.Tensor, start: torch.Tensor | None = None) -> float:
    """||c - r||_2 / ||r - start||_2 in float64 (inf when the candidate has a NaN/inf the reference lacks).

    ``start``: the value an accumulator held before this step (a main grad's earlier micro-batches); the
    error is then relative to this step's contribution, not to the accumulated total.
    """
    if candidate.shape != reference.shape:
        return float("inf")
    r = reference.detach().double()
    c = candidate.detach().to(r.device).double()
    if not torch.isfinite(c).all():
        return float("inf")
    base = r if start is None else r - start.detach().to(r.device).double()
    denom = float(torch.linalg.vector_norm(base))
    num = float(torch.linalg.vector_norm(c - r))
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom
