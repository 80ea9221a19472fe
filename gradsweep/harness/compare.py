"""Comparisons: bitwise (raw bits, NaN-aware) for invariance, normwise error for accuracy.

Both walk their tensors in slices of at most ``SLICE_ELEMENTS`` elements along the first dimension, so what a
comparison allocates is bounded whatever the tensor (a [151936, 4096] main grad's FP64 copy alone is 4.6 GiB;
on an 80 GB H100 the release chain's cells ran out of memory in these temporaries). The answers do not depend
on the slicing: counts and maxima are exact, and the norms combine each slice's FP64 norm.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

SLICE_ELEMENTS = 1 << 24  # elements per slice: each temporary stays within 128 MiB even in FP64

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


def _slices(t: torch.Tensor, limit: int | None = None) -> Iterator[slice]:
    """Row ranges of ``t`` (its first dimension) of at most ``limit`` elements each (one row at least)."""
    limit = SLICE_ELEMENTS if limit is None else limit
    rows = t.shape[0] if t.dim() else 1
    per_row = max(1, t.numel() // max(1, rows))
    step = max(1, limit // per_row)
    for lo in range(0, rows, step):
        yield slice(lo, min(rows, lo + step))


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a first dimension to slice (a 0-d tensor as one element)."""
    return t.reshape(1) if t.dim() == 0 else t


def bitwise_compare(a: torch.Tensor, b: torch.Tensor, limit: int | None = None) -> BitwiseDiff:
    """Equal iff every element has identical bits, or both are NaN (any payload). ``limit``: the slice size
    (default ``SLICE_ELEMENTS``; tests vary it)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return BitwiseDiff(False, max(a.numel(), b.numel()), float("inf"), float("inf"))
    a, b = _rows(a.detach()), _rows(b.detach())  # compared where a lives, slice by slice: no host copy of big grads
    n, max_abs, max_rel = 0, 0.0, 0.0
    for rows in _slices(a, limit):
        sa, sb = a[rows], b[rows].to(a.device)
        differ = raw_bits(sa) != raw_bits(sb)
        if a.is_floating_point():
            differ &= ~(torch.isnan(sa) & torch.isnan(sb))
        k = int(differ.sum())
        if k == 0:
            continue
        n += k
        ad, bd = sa[differ].double(), sb[differ].double()
        diff = (ad - bd).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
        # relative to the larger magnitude of the pair: meaningful where one side is 0 (at most 2 then)
        scale = torch.maximum(ad.abs(), bd.abs())
        rel = torch.where(scale > 0, diff / scale, torch.zeros_like(diff))
        rel = torch.where(torch.isinf(diff), torch.full_like(rel, float("inf")), rel)
        max_abs, max_rel = max(max_abs, float(diff.max())), max(max_rel, float(rel.max()))
    if n == 0:
        return BitwiseDiff(True, 0, 0.0, 0.0)
    return BitwiseDiff(False, n, max_abs, max_rel)


def _compute_device(*tensors: torch.Tensor | None) -> torch.device:
    """Where a comparison computes: the first accelerator among its tensors (a reference parked in host memory is
    uploaded slice by slice), else the host."""
    for t in tensors:
        if t is not None and t.device.type != "cpu":
            return t.device
    return torch.device("cpu")


def _norm(parts: list[float]) -> float:
    """The 2-norm of a vector from its slices' 2-norms (one slice: that norm, unchanged)."""
    return parts[0] if len(parts) == 1 else math.sqrt(math.fsum(x * x for x in parts))


def normwise_error(candidate: torch.Tensor, reference: torch.Tensor, start: torch.Tensor | None = None,
                   limit: int | None = None, device: torch.device | None = None) -> float:
    """||c - r||_2 / ||r - start||_2 in float64 (inf when the candidate has a NaN/inf the reference lacks).

    ``start``: the value an accumulator held before this step (a main grad's earlier micro-batches); the
    error is then relative to this step's contribution, not to the accumulated total. ``limit``: the slice size
    (default ``SLICE_ELEMENTS``; tests vary it). ``device``: where to compute (default: the first accelerator
    among the tensors, else the host), so an error is the same figure wherever its tensors wait.
    """
    if candidate.shape != reference.shape:
        return float("inf")
    ref, cand = _rows(reference.detach()), _rows(candidate.detach())
    first = None if start is None else _rows(start.detach())
    at = device if device is not None else _compute_device(cand, ref, first)
    nums: list[float] = []
    denoms: list[float] = []
    for rows in _slices(ref, limit):
        r = ref[rows].to(at).double()
        c = cand[rows].to(at).double()
        if not torch.isfinite(c).all():
            return float("inf")
        base = r if first is None else r - first[rows].to(at).double()
        denoms.append(float(torch.linalg.vector_norm(base)))
        nums.append(float(torch.linalg.vector_norm(c - r)))
    if not nums:  # an empty tensor
        return 0.0
    num, denom = _norm(nums), _norm(denoms)
    if denom == 0.0:
        return 0.0 if num == 0.0 else float("inf")
    return num / denom
