"""The comparisons walk their tensors in bounded slices and give the answers of a whole-tensor comparison.

The release chain's cells ran out of an 80 GB H100 in whole-tensor FP64 temporaries of these comparisons
(evidence/README.md); sliced, what one comparison allocates is bounded, and no verdict may move with the slicing.
"""

from __future__ import annotations

import math

import pytest
import torch

from gradsweep.harness import compare
from gradsweep.harness.compare import BitwiseDiff, bitwise_compare, normwise_error

LIMITS = (1, 7, 64, 1000, None)


def _whole_bitwise(a: torch.Tensor, b: torch.Tensor) -> BitwiseDiff:
    """The whole-tensor comparison (the oracle)."""
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}
    ia = a.contiguous().view(bits[a.element_size()]) if a.is_floating_point() else a
    ib = b.contiguous().view(bits[b.element_size()]) if b.is_floating_point() else b
    differ = ia != ib
    if a.is_floating_point():
        differ &= ~(torch.isnan(a) & torch.isnan(b))
    n = int(differ.sum())
    if n == 0:
        return BitwiseDiff(True, 0, 0.0, 0.0)
    ad, bd = a[differ].double(), b[differ].double()
    diff = (ad - bd).abs().nan_to_num(nan=math.inf)
    scale = torch.maximum(ad.abs(), bd.abs())
    rel = torch.where(scale > 0, diff / scale, torch.zeros_like(diff))
    rel = torch.where(torch.isinf(diff), torch.full_like(rel, math.inf), rel)
    return BitwiseDiff(False, n, float(diff.max()), float(rel.max()))


def _planted(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A pair that differs in a few elements, with NaN in both (equal), NaN in one (a difference), -0.0 / 0.0."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(shape, generator=g).to(dtype)
    b = a.clone()
    flat_a, flat_b = a.view(-1), b.view(-1)
    n = flat_a.numel()
    if n >= 8:
        idx = torch.randperm(n, generator=g)[:8]
        flat_b[idx[:3]] += 0.5
        flat_a[idx[3]] = flat_b[idx[3]] = float("nan")
        flat_b[idx[4]] = float("nan")
        flat_a[idx[5]], flat_b[idx[5]] = 0.0, -0.0
        flat_b[idx[6]] = float("inf")
    return a, b


@pytest.mark.parametrize("shape", [(37, 5), (300,), (4, 9, 11), (1, 100), (100, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_bitwise_compare_gives_the_whole_tensor_answer_at_every_slice_size(shape, dtype):
    a, b = _planted(shape, dtype, seed=len(shape) * 31 + shape[0])
    want = _whole_bitwise(a, b)
    assert not want.equal and math.isinf(want.max_abs)
    for limit in LIMITS:
        assert bitwise_compare(a, b, limit=limit) == want, limit
        assert bitwise_compare(a, a.clone(), limit=limit) == BitwiseDiff(True, 0, 0.0, 0.0)


def test_bitwise_compare_edge_shapes_and_integers():
    ints = torch.arange(50).reshape(10, 5)
    other = ints.clone()
    other[3, 2] = -1
    for limit in LIMITS:
        assert bitwise_compare(ints, other, limit=limit) == _whole_bitwise(ints, other)
        assert bitwise_compare(torch.tensor(1.5), torch.tensor(2.5), limit=limit) == BitwiseDiff(False, 1, 1.0, 0.4)
        assert bitwise_compare(torch.empty(0, 4), torch.empty(0, 4), limit=limit).equal
    strided = torch.randn(20, 16)[:, ::2]  # not contiguous: sliced rows are compared by their own bits
    assert bitwise_compare(strided, strided.clone(), limit=3).equal
    changed = strided.clone()
    changed[19, 7] += 1.0
    assert bitwise_compare(strided, changed, limit=3).mismatched == 1


def _whole_normwise(c: torch.Tensor, r: torch.Tensor, start: torch.Tensor | None) -> float:
    r, c = r.double(), c.double()
    if not torch.isfinite(c).all():
        return math.inf
    base = r if start is None else r - start.double()
    num, denom = float(torch.linalg.vector_norm(c - r)), float(torch.linalg.vector_norm(base))
    return (0.0 if num == 0.0 else math.inf) if denom == 0.0 else num / denom


@pytest.mark.parametrize("with_start", [False, True])
def test_normwise_error_is_the_whole_tensor_error_at_every_slice_size(with_start):
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(257, 33, generator=g, dtype=torch.float64)
    cand = (ref + 1e-3 * torch.randn(257, 33, generator=g, dtype=torch.float64)).float()
    start = torch.randn(257, 33, generator=g) if with_start else None
    want = _whole_normwise(cand, ref, start)
    assert normwise_error(cand, ref, start) == want  # one slice: the same arithmetic, the same bits
    for limit in LIMITS:
        assert normwise_error(cand, ref, start, limit=limit) == pytest.approx(want, rel=1e-12), limit


def test_normwise_error_edge_cases_at_every_slice_size():
    ref = torch.randn(40, 6, dtype=torch.float64)
    bad = ref.float().clone()
    bad[39, 5] = float("nan")
    for limit in LIMITS:
        assert normwise_error(bad, ref, limit=limit) == math.inf  # a NaN in the last slice is still seen
        exact = ref.float().double()
        assert normwise_error(exact.float(), exact, start=exact.float(), limit=limit) == 0.0  # nothing to judge
        assert normwise_error(exact.float() + 1, exact, start=exact.float(), limit=limit) == math.inf
        assert normwise_error(torch.zeros(0, 3), torch.zeros(0, 3, dtype=torch.float64), limit=limit) == 0.0
        assert normwise_error(torch.tensor(2.0), torch.tensor(1.0, dtype=torch.float64), limit=limit) == 1.0
    assert normwise_error(torch.zeros(3), torch.zeros(4, dtype=torch.float64)) == math.inf


def test_no_slice_exceeds_the_limit(monkeypatch):
    """What one comparison step touches is bounded by the limit (the memory bound the slicing is for)."""
    seen: list[int] = []
    real_bits, real_norm = compare.raw_bits, torch.linalg.vector_norm

    def bits(t):
        seen.append(t.numel())
        return real_bits(t)

    def norm(t, *args, **kwargs):
        seen.append(t.numel())
        return real_norm(t, *args, **kwargs)

    monkeypatch.setattr(compare, "raw_bits", bits)
    monkeypatch.setattr(compare.torch.linalg, "vector_norm", norm)
    a, b = _planted((1000, 12), torch.float32, seed=3)
    bitwise_compare(a, b, limit=120)
    normwise_error(torch.ones_like(a), a.nan_to_num().double(), limit=120)
    assert seen and max(seen) <= 120 and sum(seen) >= 4 * a.numel()
