"""The fold's staging copy by pieces (``take_tiles(..., stage_copy=...)``; the Triton family's ``copy_pieces``)
stages exactly what the row-index copy stages.

The piece copy only changes how staged rows reach the staging tensors: the plan (descriptors, staging rows, rows
read in place), the staging contents every tile reads and the fold's state after each call must equal the index
path's, call by call, on random steps (every tile size, pieces over calls in any order, runs with pads, rows from
scrambled tensors), with either planner, and on replayed calls too. Then the main grads of a real fold (Triton
rms_norm dweight, Triton GEMM dW) over a chunked step are compared bit for bit between the two copies."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradsweep import canonical
from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels import _common
from gradsweep.triton_kernels import gemm as triton_gemm
from gradsweep.triton_kernels import rms_norm as triton_rms
from gradsweep.triton_kernels.stage_copy import copy_pieces
from tests import test_canonical_plan_speed_equivalence as digests
from tests.test_fold_plan_native import _state

PLANNERS = [pytest.param(canonical._native_plan, id="compiled"), pytest.param(None, id="numpy")]


def _reads(step, tensors) -> list:
    out = []
    for row0, count in step.host_desc.tolist():  # the rows each tile reads, from the call or from staging
        src, r = (tensors, row0) if row0 >= 0 else (step.stage, -row0 - 1)
        out.append([t[r:r + count].tolist() for t in src])
    return out


def use_planner(planner, replay: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy planner where ``planner`` is None (or no compiled one is built), the transition cache off unless
    ``replay``, every plan cache empty: the setting of one (planner, replay) case."""
    if planner is None or canonical._native_plan is None:
        monkeypatch.setattr(canonical, "_native_plan", None)
    if not replay:
        monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 0)
    canonical.clear_plan_caches()


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("replay", [False, True], ids=["planned", "replayed"])
def test_pieces_stage_what_the_index_stages(planner, replay, monkeypatch):
    use_planner(planner, replay, monkeypatch)
    rng = np.random.default_rng(7)
    staged_calls = pieces_calls = 0
    for trial in range(20):
        lengths, tile = digests._lengths(rng), int(rng.choice(digests.TILES))
        calls = digests._pieces(rng, lengths)
        make = [digests._as_packed, lambda c: digests._as_runs(rng, c), lambda c: digests._as_rows(rng, c)]
        shapes = [int(rng.integers(0, 3)) for _ in calls]
        for _ in range(2 if replay else 1):  # replayed: the same step again, from the transition cache
            folds = [CanonicalFold(torch.zeros(2), lengths, tile) for _ in range(2)]
            for k, (call, how) in enumerate(zip(calls, shapes)):
                rows = make[how](call)
                tensors = digests._tensors(rows, 1000 * trial + k)
                a = folds[0].take_tiles(rows, tensors)
                b = folds[1].take_tiles(rows, tensors, stage_copy=copy_pieces)
                assert (a.first_tile, a.host_desc.tolist(), a.stage_rows, a.in_place_rows) == \
                       (b.first_tile, b.host_desc.tolist(), b.stage_rows, b.in_place_rows), (trial, k)
                assert _reads(a, tensors) == _reads(b, tensors), (trial, k)
                assert _state(folds[0]) == _state(folds[1]), (trial, k)
                staged_calls += a.stage_rows > 0
                pieces_calls += any(row0 < 0 for row0, _ in b.host_desc.tolist())
    assert staged_calls > 0 and pieces_calls > 0


def _chunked_rows(lengths: list[int], parts: int) -> list[RowIdentity]:
    """Every sample cut into ``parts`` calls (the chunked-prefill layout the piece copy is for)."""
    cuts = [np.linspace(0, n, parts + 1).astype(int) for n in lengths]
    return [RowIdentity.packed([int(c[k + 1] - c[k]) for c in cuts], list(range(len(lengths))),
                               [int(c[k]) for c in cuts]) for k in range(parts)]


def _rms_main_grad(lengths: list[int], parts: int, hidden: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(11)
    weight = torch.randn(hidden, generator=gen).to(torch.bfloat16)
    main = torch.randn(hidden, generator=gen)
    fold = CanonicalFold(main, lengths, triton_rms.TILE)
    for rows in _chunked_rows(lengths, parts):
        x = torch.randn(rows.num_rows, hidden, generator=gen).to(torch.bfloat16)
        dy = torch.randn(rows.num_rows, hidden, generator=gen).to(torch.bfloat16)
        triton_rms.rms_norm_backward(x, weight, dy, 1e-6, rows, fold, need_dx=False)
    return fold.main_grad.clone()


def _dw_main_grad(lengths: list[int], parts: int, n: int, k: int, gemm=triton_gemm,
                  device: str = "cpu") -> torch.Tensor:
    """A chunked step's dW main grad through ``gemm``'s det_linear (a family's GEMM module) on ``device``."""
    gen = torch.Generator(device=device).manual_seed(13)
    weight = torch.randn(n, k, generator=gen, device=device).to(torch.bfloat16).requires_grad_(True)
    fold = CanonicalFold(torch.randn(n, k, generator=gen, device=device), lengths, gemm.TILE)
    for rows in _chunked_rows(lengths, parts):
        x = torch.randn(rows.num_rows, k, generator=gen, device=device).to(torch.bfloat16)
        y = gemm.det_linear(x, weight, rows, fold)
        y.backward(torch.randn(y.shape, generator=gen, device=device).to(torch.bfloat16))
    return fold.main_grad.clone()


@pytest.mark.parametrize("which", ["rms_norm", "det_gemm"])
def test_main_grads_are_the_same_bits_with_either_copy(which, monkeypatch):
    """Before / after: the chunked step's main grad with the piece copy (the family's default now) and with the
    index copy forced (``copy_pieces`` replaced by None at the call site), compared as raw bits."""
    lengths = [70, 3, 129, 64, 1, 90]
    run = (lambda: _rms_main_grad(lengths, 3, 48)) if which == "rms_norm" else \
        (lambda: _dw_main_grad(lengths, 3, 24, 40))
    site = _common if which == "rms_norm" else triton_gemm
    pieces_seen: list[int] = []

    def spy(pieces, src, dst, longest):
        pieces_seen.append(pieces.shape[0])
        copy_pieces(pieces, src, dst, longest)

    monkeypatch.setattr(site, "copy_pieces", spy)
    canonical.clear_plan_caches()
    with_pieces = run()
    assert max(pieces_seen, default=0) > 1  # the piece copy ran, on calls staging several pieces
    monkeypatch.setattr(site, "copy_pieces", None)
    canonical.clear_plan_caches()
    with_index = run()
    assert torch.equal(with_pieces.view(torch.int32), with_index.view(torch.int32))
    assert not torch.equal(with_pieces, torch.zeros_like(with_pieces))
