"""The canonical fold and the logical workload: the two pieces every layout's equality rests on."""

from __future__ import annotations

import random

import pytest
import torch

from gradsweep.canonical import CanonicalFold, RowIdentity, fold_reference
from gradsweep.harness.compare import bitwise_compare
from gradsweep.workload import Workload

LENGTHS = [37, 5, 64, 1, 23]


def _fold(calls: list[RowIdentity], contrib_of, tile: int = 8) -> torch.Tensor:
    fold = CanonicalFold(torch.zeros(16), LENGTHS, tile)
    for rows in calls:
        c = contrib_of(rows)
        step = fold.take(rows, (c,))
        fold.main_grad.copy_(fold_reference(step, step.tensors[0], fold.main_grad))
    return fold.finish()


def _contrib(rows: RowIdentity) -> torch.Tensor:
    w = Workload(3, tuple(LENGTHS))
    return w.values("c", rows, (16,)).float() * 1e3


def _split(rows: RowIdentity, sizes: list[int]) -> list[RowIdentity]:
    out, start = [], 0
    for n in sizes:
        out.append(RowIdentity(rows.sample[start:start + n], rows.position[start:start + n]))
        start += n
    return out


def test_fold_gives_the_same_bits_for_any_split_order_or_padding():
    full = RowIdentity.packed(LENGTHS)
    ref = _fold([full], _contrib)
    rng = random.Random(0)
    for trial in range(6):
        cuts = sorted(rng.sample(range(1, 130), 5))
        sizes = [b - a for a, b in zip([0, *cuts], [*cuts, 130])]
        calls = _split(full, sizes)
        if trial % 2:
            calls = calls[::-1]  # backward of later calls first
        assert bitwise_compare(_fold(calls, _contrib), ref).equal
    perm = torch.randperm(130)
    permuted = RowIdentity(full.sample[perm], full.position[perm])
    assert bitwise_compare(_fold([permuted], _contrib), ref).equal
    padded = RowIdentity(torch.cat([full.sample, torch.full((7,), -1)]), torch.cat([full.position,
                                                                                     torch.zeros(7, dtype=torch.long)]))
    assert bitwise_compare(_fold([padded], _contrib), ref).equal


def test_stock_style_per_call_sum_differs():
    """The defect the fold exists to remove: summing each call then adding changes the bits."""
    full = RowIdentity.packed(LENGTHS)
    per_call = torch.zeros(16)
    for rows in _split(full, [50, 30, 50]):
        per_call = per_call + _contrib(rows).sum(0)
    assert not bitwise_compare(per_call, _fold([full], _contrib)).equal


def test_fold_refuses_duplicates_and_reports_missing_tokens():
    full = RowIdentity.packed(LENGTHS)
    fold = CanonicalFold(torch.zeros(16), LENGTHS, 8)
    fold.take(full, (_contrib(full),))
    with pytest.raises(ValueError, match="twice"):
        fold.take(RowIdentity.packed([3]), (torch.zeros(3, 16),))
    fold = CanonicalFold(torch.zeros(16), LENGTHS, 8)
    fold.take(RowIdentity.packed([37]), (torch.zeros(37, 16),))
    with pytest.raises(ValueError, match="never completed"):
        fold.finish()


def test_fold_plan_is_tile_aligned_to_sample_starts():
    fold = CanonicalFold(torch.zeros(1), [5, 3], 4)
    rows = RowIdentity.packed([5, 3])
    step = fold.take(rows, (torch.zeros(8, 1),))
    assert step.plan.tolist() == [[0, 1, 2, 3], [4, -1, -1, -1], [5, 6, 7, -1]]


def test_workload_values_are_a_pure_function_of_logical_identity():
    w = Workload(11, tuple(LENGTHS))
    full = RowIdentity.packed(LENGTHS)
    perm = torch.randperm(130)
    a = w.values("x", full, (4, 3))
    b = w.values("x", RowIdentity(full.sample[perm], full.position[perm]), (4, 3))
    assert bitwise_compare(a[perm], b).equal
    assert not bitwise_compare(a, w.values("y", full, (4, 3))).equal
    pads = RowIdentity(torch.full((4,), -1), torch.zeros(4, dtype=torch.long))
    assert (~torch.isfinite(w.values("x", pads, (64,)))).any(-1).all()  # pads: NaN / inf, never zeros
    assert (~torch.isfinite(w.upstream("y", pads, (64,)))).any(-1).all()  # and NaN / inf gradients
    fillers = RowIdentity(torch.tensor([-2, -2, -3]), torch.arange(3))
    g = w.upstream("y", fillers, (64,))
    assert torch.isfinite(g).all() and (g != 0).any(-1).all()  # fillers: finite, nonzero (never a harmless 0)
    start = w.main_grad_start("W", (3, 5), 0.25)
    assert start.dtype == torch.float32 and (start != 0).all()
    assert torch.equal(start, w.main_grad_start("W", (3, 5), 0.25))  # a pure function of (seed, name)
    mask = w.active_mask(full)
    assert 0 < int(mask.sum()) < 130 and w.active_denominator() == int(mask.sum())
