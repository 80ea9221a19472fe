"""The compiled fold planner (csrc/host/fold_plan.cpp, ``gradsweep._fold_plan``) gives the numpy path's plans.

canonical.py plans a ``take_tiles`` call, a step's layout, the whole-step closed form and a packed call's runs in
C++ where the module was built, else in numpy. Both must hand kernels the same values in the same order: the
recorded digests and the golden file pin them (tests/test_canonical_plan_speed_equivalence.py,
tests/test_fold_plan_golden.py, which run whichever path this checkout has); here the same checks run again
with the numpy path forced, and the two paths run side by side on random steps, every call's result and the
fold's whole state compared after it. A box with a C++ compiler must have built the module (else the fast path
would be silently gone).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from gradsweep import canonical
from gradsweep.canonical import CanonicalFold, RowIdentity
from tests import test_canonical_plan_speed_equivalence as digests
from tests import test_fold_plan_golden as golden
from tests.helpers import seeing_fold_uploads

NATIVE = canonical._native_plan


@pytest.fixture
def numpy_path(monkeypatch):
    monkeypatch.setattr(canonical, "_native_plan", None)
    canonical.clear_plan_caches()
    yield
    canonical.clear_plan_caches()


def test_the_compiled_planner_is_built_where_a_compiler_is():
    if not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("no C++ compiler on this box: the numpy path is the planner")
    assert NATIVE is not None, "gradsweep._fold_plan was not built (setup.py builds it with the host compiler)"


@pytest.mark.parametrize("name", sorted(digests.DIGESTS))
def test_numpy_path_keeps_the_recorded_digests(name, numpy_path, no_replay):
    assert digests.DIGESTS[name]() == digests.EXPECTED[name]


def test_numpy_path_matches_the_golden_file(numpy_path):
    golden.test_every_plan_field_matches_the_golden_file()


no_replay = digests.no_replay


def _state(fold: CanonicalFold) -> tuple:
    return (fold.cursor, fold._lo.tolist(), fold._hi.tolist(), fold._block_of_tile.tolist(), list(fold._free),
            fold._stage_blocks, [tuple(t.shape) for t in fold._backing])


def _step(fold: CanonicalFold, rows: RowIdentity, tensors, native, table: bool) -> tuple:
    """One take_tiles (``table``: take) call on ``fold`` with the chosen planner, and everything it gave a kernel."""
    canonical._native_plan = native
    seen: list = []
    try:
        with seeing_fold_uploads(seen.append):
            step = (fold.take if table else fold.take_tiles)(rows, tensors)
    except ValueError as e:
        return ("error", str(e))
    if table:
        plan = step.plan.long()
        reads = [t[plan[plan >= 0]].tolist() for t in step.tensors]  # (-1: a zero row, nothing read)
        return (step.first_tile, step.plan.dtype, plan.tolist(), [a.tolist() for a in seen], reads, _state(fold))
    reads = []
    for row0, count in step.host_desc.tolist():
        src, r = (tensors, row0) if row0 >= 0 else (step.stage, -row0 - 1)
        reads.append([t[r:r + count].tolist() for t in src])
    return (step.first_tile, step.host_desc.dtype, step.host_desc.tolist(), step.stage_rows, step.in_place_rows,
            [a.tolist() for a in seen], reads, _state(fold))


@pytest.mark.skipif(NATIVE is None, reason="gradsweep._fold_plan not built here")
@pytest.mark.parametrize("seed", range(6))
def test_native_and_numpy_plans_agree_call_by_call(seed, monkeypatch):
    """Random steps (empty samples, tiles 1-128, pieces over calls in any order, runs with pads, rows found from
    scrambled tensors, a duplicate token planted now and then; descriptors or row tables), each call planned by
    both paths on two folds in the same state: the same plans, uploads, rows read, errors and fold state after."""
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 0)  # computed every time, never replayed
    canonical.clear_plan_caches()
    rng = np.random.default_rng(1000 + seed)
    seen = {"staged": 0, "whole": 0, "error": 0, "table": 0}
    for trial in range(40):
        lengths, tile = digests._lengths(rng), int(rng.choice(digests.TILES))
        calls = digests._pieces(rng, lengths)
        if rng.random() < 0.2 and calls and calls[0]:
            calls.append([calls[0][0]])  # a token twice: both must refuse it the same way
        make = [digests._as_packed, lambda c: digests._as_runs(rng, c), lambda c: digests._as_rows(rng, c)]
        table = bool(rng.random() < 0.3)  # the row-table path (take) for the whole step
        folds = []
        for native in (NATIVE, None):  # each fold's layout built by its own path
            canonical._native_plan = native
            canonical._layout.cache_clear()
            folds.append(CanonicalFold(torch.zeros(2), lengths, tile))
        assert all(np.array_equal(getattr(folds[0]._layout, a), getattr(folds[1]._layout, a)) for a in
                   ("tiles_per_sample", "slot_base", "slot_end", "lo", "hi", "tile_first", "expected"))
        for k, call in enumerate(calls):
            rows = make[int(rng.integers(0, 3))](call)
            tensors = digests._tensors(rows, 1000 * trial + k)
            got = [_step(fold, rows, tensors, native, table) for fold, native in zip(folds, (NATIVE, None))]
            assert got[0] == got[1], (seed, trial, k, table)
            if got[0][0] == "error":
                seen["error"] += 1
                break
            if table:
                seen["table"] += 1
                continue
            seen["staged"] += any(row0 < 0 for row0, _ in got[0][2])
            seen["whole"] += k == 0 and got[0][0] == 0 and len(got[0][2]) == folds[0].total_tiles > 0
    canonical._native_plan = NATIVE
    assert min(seen.values()) > 0, seen  # staged tiles, whole steps and refusals all met


@pytest.mark.skipif(NATIVE is None, reason="gradsweep._fold_plan not built here")
def test_packed_runs_take_what_the_python_loop_takes(monkeypatch):
    """``RowIdentity.packed``'s compiled runs equal the Python loop's, and a value the compiled path refuses (a
    float length) still gets the loop's answer."""
    cases = [([3, 0, 2], None, None), ([2, 2, 1], [0, 0, 1], [0, 2, 0]), ([4, 3], [1, 0], [5, 0]),
             ((1, 1, 1), range(3), (0, 0, 0)), ([2.0, 3], [0, 1], [0, 0]), ([np.int64(2), 1], None, None),
             ([], None, None)]
    for lengths, ids, starts in cases:
        got = []
        for native in (NATIVE, None):
            monkeypatch.setattr(canonical, "_native_plan", native)
            r = RowIdentity.packed(lengths, ids, starts)
            got.append((r.num_rows, r.runs.key, r.runs.total, r.sample.tolist(), r.position.tolist()))
        assert got[0] == got[1], lengths
    for native in (NATIVE, None):
        monkeypatch.setattr(canonical, "_native_plan", native)
        with pytest.raises(ValueError, match="sample ids >= 0"):
            RowIdentity.packed([2], sample_ids=[-1])
