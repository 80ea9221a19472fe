"""The fold's host cost (issue 13): the faster planning gives exactly the plans of before, for any input.

Randomised steps (sample lengths with empty samples, tiles from 1 to 128, every sample cut into pieces spread
over calls in any order, pads, scrambled rows, bad inputs) are planned with ``take_tiles`` and ``take``; every
value a kernel receives (descriptors, index tables, every array uploaded, including the staging copies' indices,
staging sizes, the rows each tile reads), the row identities,
their runs and the errors raised are hashed. The expected digests were recorded with the planning code of
before the speed-up (``gradsweep/canonical.py`` at commit 9232b5a, run as
``python tests/test_canonical_plan_speed_equivalence.py``), so any change of a plan shows here.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from gradsweep import canonical
from gradsweep.bench.catalog.fold_plan import _thirds, cases
from gradsweep.canonical import CanonicalFold, RowIdentity
from tests.helpers import seeing_fold_uploads

TILES = (1, 2, 3, 8, 16, 64, 128)
TRIALS = 60


class _Digest:
    """A running hash of arrays, tensors and scalars (dtype and shape included)."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def add(self, *items: object) -> None:
        for x in items:
            if isinstance(x, torch.Tensor):
                x = x.detach().cpu().contiguous().numpy()
            if isinstance(x, np.ndarray):
                self.h.update(f"{x.dtype}{x.shape}".encode())
                self.h.update(np.ascontiguousarray(x).tobytes())
            else:
                self.h.update(repr(x).encode())

    def hex(self) -> str:
        return self.h.hexdigest()


def _uploads_to(d: _Digest):
    """Hash every host array the fold uploads (descriptors, index tables, staging copy indices) too."""
    return seeing_fold_uploads(lambda a: d.add("upload", a))


def _lengths(rng: np.random.Generator) -> list[int]:
    n = rng.integers(0, 160, size=int(rng.integers(1, 14)))
    n[rng.random(len(n)) < 0.15] = 0
    return n.tolist()


def _pieces(rng: np.random.Generator, lengths: list[int]) -> list[list[tuple[int, int, int]]]:
    """Every token once: each sample cut at random points (some empty pieces), pieces spread over calls."""
    n_calls = int(rng.integers(1, 5))
    calls: list[list[tuple[int, int, int]]] = [[] for _ in range(n_calls)]
    for s, n in enumerate(lengths):
        cuts = sorted(rng.integers(0, n + 1, size=int(rng.integers(0, 4))).tolist())
        for a, b in zip([0, *cuts], [*cuts, n]):
            calls[int(rng.integers(0, n_calls))].append((s, a, b - a))
    for call in calls:
        if rng.random() < 0.4:
            rng.shuffle(call)
        elif rng.random() < 0.5:
            call.sort()  # consecutive pieces of one sample continue each other: merged runs
    if rng.random() < 0.4:
        calls = calls[::-1]
    return calls


def _as_packed(call: list[tuple[int, int, int]]) -> RowIdentity:
    return RowIdentity.packed([p[2] for p in call], [p[0] for p in call], [p[1] for p in call])


def _as_runs(rng: np.random.Generator, call: list[tuple[int, int, int]]) -> RowIdentity:
    """The pieces as runs with pad rows between them, given in a shuffled order."""
    row0, r = [], int(rng.integers(0, 3))
    for _, _, n in call:
        row0.append(r)
        r += n + int(rng.integers(0, 3))
    order = rng.permutation(len(call)) if call else np.zeros(0, dtype=np.int64)
    pick = [call[i] for i in order]
    return RowIdentity.from_runs(r + int(rng.integers(0, 2)), [p[0] for p in pick], [p[1] for p in pick],
                                 [row0[i] for i in order], [p[2] for p in pick])


def _as_rows(rng: np.random.Generator, call: list[tuple[int, int, int]]) -> RowIdentity:
    """The pieces as plain per-row tensors (pads, scrambled at times): runs found from the rows."""
    ident = _as_runs(rng, call)
    sample, position = ident.sample.clone(), ident.position.clone()
    if rng.random() < 0.3:
        perm = torch.from_numpy(rng.permutation(len(sample)))
        sample, position = sample[perm], position[perm]
    return RowIdentity(sample, position)


def _add_rows(d: _Digest, rows: RowIdentity) -> None:
    r = rows.runs
    d.add(rows.num_rows, rows.sample, rows.position, r.sample, r.pos0, r.row0, r.length, r.total)


def _tensors(rows: RowIdentity, seed: int) -> tuple[torch.Tensor, ...]:
    ident = torch.stack([rows.sample, rows.position], 1)
    return ident, torch.randn(rows.num_rows, 3, generator=torch.Generator().manual_seed(seed))


def _add_tile_step(d: _Digest, fold: CanonicalFold, rows: RowIdentity, tensors: tuple[torch.Tensor, ...]) -> None:
    step = fold.take_tiles(rows, tensors)
    d.add(step.first_tile, step.tile, step.num_tiles, step.stage_rows, step.staged, step.host_desc, step.desc,
          *step.direct_rows(), step.stage is tensors, [(tuple(s.shape), s.dtype) for s in step.stage])
    for row0, count in step.host_desc.tolist():  # the rows each tile reads
        src, r = (tensors, row0) if row0 >= 0 else (step.stage, -row0 - 1)
        d.add(*(t[r:r + count] for t in src))
    d.add(fold.cursor, fold.done, fold.expected_rows(step.first_tile, step.num_tiles))


def _add_table_step(d: _Digest, fold: CanonicalFold, rows: RowIdentity, tensors: tuple[torch.Tensor, ...]) -> None:
    step = fold.take(rows, tensors)
    plan = step.plan.long()
    d.add(step.first_tile, step.num_tiles, step.plan, [(tuple(t.shape), t.dtype) for t in step.tensors])
    d.add(*(torch.where((plan >= 0).view(*plan.shape, 1), t[plan.clamp(min=0)], 0) for t in step.tensors))
    d.add(fold.cursor, fold.done)


def _step_digest(kind: str, seed: int, uploads: bool = True) -> str:
    rng = np.random.default_rng(seed)
    d = _Digest()
    if not uploads:  # a replayed plan uploads nothing: compare what the kernels receive
        _plan_trials(d, rng, kind)
        return d.hex()
    with _uploads_to(d):
        _plan_trials(d, rng, kind)
    return d.hex()


def _plan_trials(d: _Digest, rng: np.random.Generator, kind: str) -> None:
    for trial in range(TRIALS):
        lengths, tile = _lengths(rng), int(rng.choice(TILES))
        calls = [[(s, 0, n) for s, n in enumerate(lengths)]] if kind == "packed" else _pieces(rng, lengths)
        make = {"packed": lambda c: RowIdentity.packed([p[2] for p in c]), "pieces": _as_packed,
                "runs": lambda c: _as_runs(rng, c), "rows": lambda c: _as_rows(rng, c),
                "table": _as_packed}[kind]
        fold = CanonicalFold(torch.zeros(2), lengths, tile)
        d.add(lengths, tile, fold.total_tiles)
        for k, call in enumerate(calls):
            rows = make(call)
            _add_rows(d, rows)
            tensors = _tensors(rows, 1000 * trial + k)
            (_add_table_step if kind == "table" else _add_tile_step)(d, fold, rows, tensors)
        d.add(fold.done, fold.finish().shape)


def _bench_digest() -> str:
    """The bench case ``fold_plan`` (16384 rows in 13 samples, one call and three calls, tile 64)."""
    d = _Digest()
    with _uploads_to(d):
        _bench_plans(d, cases(False))
    return d.hex()


def _bench_plans(d: _Digest, bench_cases: list) -> None:
    for case in bench_cases:
        if case.extra.get("warm"):  # the same plans as the cold case of its layout
            continue
        lengths = [int(n) for n in case.lengths]
        cuts = [[n] if case.extra["calls"] == 1 else _thirds(n) for n in lengths]
        fold = CanonicalFold(torch.zeros(2), lengths, 64)
        for k in range(len(cuts[0])):
            call = [(s, sum(c[:k]), c[k]) for s, c in enumerate(cuts) if c[k] > 0]
            rows = _as_packed(call)
            _add_rows(d, rows)
            _add_tile_step(d, fold, rows, _tensors(rows, k))
        d.add(fold.done)


def _error_digest() -> str:
    """Messages of the refusals (bad lengths, tiles, ids, positions, duplicates, overlapping runs)."""
    d = _Digest()
    attempts = [
        lambda: CanonicalFold(torch.zeros(2), [3, -1], 4),
        lambda: CanonicalFold(torch.zeros(2), [3], 0),
        lambda: CanonicalFold(torch.zeros(2, dtype=torch.float64), [3], 4),
        lambda: RowIdentity.packed([2], sample_ids=[-1]),
        lambda: RowIdentity.from_runs(3, [0], [0], [2], [2]),
        lambda: RowIdentity.from_runs(4, [0, 1], [0, 0], [2, 1], [2, 2]),
        lambda: CanonicalFold(torch.zeros(2), [4, 4], 4).take_tiles(RowIdentity.packed([1], [2]), ()),
        lambda: CanonicalFold(torch.zeros(2), [4, 4], 4).take_tiles(RowIdentity.packed([2], starts=[3]), ()),
        lambda: CanonicalFold(torch.zeros(2), [4, 4], 4).take_tiles(RowIdentity.packed([2], starts=[-1]), ()),
        lambda: CanonicalFold(torch.zeros(2), [4, 4], 4).take_tiles(RowIdentity.packed([2, 1], [1, 1], [0, 1]), ()),
        lambda: CanonicalFold(torch.zeros(2), [4, 4], 4).take_tiles(RowIdentity.packed([2]), (torch.zeros(3),)),
        lambda: CanonicalFold(torch.zeros(2), [4, 4], 4).finish(),
    ]
    for attempt in attempts:
        try:
            attempt()
            d.add("ok")
        except ValueError as e:
            d.add(type(e).__name__, str(e))
    fold = CanonicalFold(torch.zeros(2), [4, 4], 4)
    fold.take_tiles(RowIdentity.packed([3]), ())
    for rows in (RowIdentity.packed([3]), RowIdentity(torch.tensor([1, 1]), torch.tensor([2, 2]))):
        try:
            fold.take_tiles(rows, ())
        except ValueError as e:
            d.add(str(e))
    return d.hex()


# Recorded with the planning code of before the speed-up (see the module docstring).
EXPECTED = {
    "packed": "44d0020c5a9d8046732fdcaf2934ccbdaca10f03cd25139088b473054c8b8f57",
    "pieces": "691fa3c202196925ade6045f4c8aed3b9d7d0d08f525db4f18d93e70c58e6892",
    "runs": "400d9eb8170a624d27ddfe5f706c23046eb75590ad64e1f80734aa4af06e7624",
    "rows": "f8dde2766851d705cf9ae2924fdd5a3ca2afba891622ac1f855c9ce7d974af8a",
    "table": "78c64e364397e266dbf7f2c63984587a0b10882eb8ac70b1118a311a412d70b4",
    "bench": "2bd10c5e80c07d478e8c56bd9cee17f99ec9e913a574f951f0dbe440925afec3",
    "errors": "f1d50a4a92e51931883106606f4b01621249604682d7efa2a30e063ec7beb067",
}

DIGESTS = {
    **{kind: (lambda kind=kind, seed=seed: _step_digest(kind, seed)) for seed, kind in
       enumerate(("packed", "pieces", "runs", "rows", "table"))},
    "bench": _bench_digest,
    "errors": _error_digest,
}


@pytest.fixture
def no_replay(monkeypatch):
    """Plans computed, never replayed from the transition cache (the digests hash every upload)."""
    canonical.clear_plan_caches()
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 0)
    yield
    canonical.clear_plan_caches()


@pytest.mark.parametrize("name", sorted(DIGESTS))
def test_plans_keep_the_digests_of_before(name, no_replay):
    assert DIGESTS[name]() == EXPECTED[name]


@pytest.mark.parametrize("kind", ["packed", "pieces", "runs", "rows", "table"])
def test_replayed_transitions_give_the_computed_plans(kind, monkeypatch):
    """A second pass over the same steps replays cached transitions (fresh folds meeting the same state and
    calls, as a step's other parameters do): every descriptor, table, row read and fold state is the same as
    when computed, and a planted wrong replay is seen."""
    canonical.clear_plan_caches()
    hits = []
    real = CanonicalFold._replay

    def counted(self, key):
        out = real(self, key)
        hits.append(out is not None)
        return out

    monkeypatch.setattr(CanonicalFold, "_replay", counted)
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 0)
    computed = _step_digest(kind, 7, uploads=False)  # nothing kept: every plan computed
    assert not any(hits)
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 4096)
    assert _step_digest(kind, 7, uploads=False) == computed  # kept (and replayed where a state repeats)
    hits.clear()
    assert _step_digest(kind, 7, uploads=False) == computed  # replayed: every call met before
    assert sum(hits) > 0
    key, entry = next(iter(canonical._TRANSITIONS.items()))  # plant: the oldest cached cursor moved by one tile
    canonical._TRANSITIONS[key] = (*entry[:2], max(entry[2] - 1, 0) if entry[2] else 1, *entry[3:])
    try:
        planted = _step_digest(kind, 7, uploads=False)
    except ValueError:  # the fold saw a tile never completed
        planted = None
    assert planted != computed
    canonical.clear_plan_caches()


@pytest.mark.parametrize("kind", ["pieces", "runs", "rows", "table"])
def test_staging_calls_replay_by_call_sequence(kind, monkeypatch):
    """Calls that stage or carry rows (chunked steps) are cached by the fold's call sequence: a second pass with
    fresh folds replays every call (state-keyed or sequence-keyed), staging copies included, and gives the bits
    of the computed pass; a planted wrong staging copy in a replayed entry is seen."""
    canonical.clear_plan_caches()
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 1 << 16)
    served = {"state": 0, "sequence": 0, "computed": 0}
    real_state, real_seq, real_remember = CanonicalFold._replay, CanonicalFold._replay_staged, \
        CanonicalFold._remember_staged

    def by_state(self, key):
        out = real_state(self, key)
        served["state"] += out is not None
        return out

    def by_sequence(self, key, tensors):
        out = real_seq(self, key, tensors)
        served["sequence"] += out is not None
        return out

    def computed(self, key, copy, result):
        served["computed"] += 1
        return real_remember(self, key, copy, result)

    monkeypatch.setattr(CanonicalFold, "_replay", by_state)
    monkeypatch.setattr(CanonicalFold, "_replay_staged", by_sequence)
    monkeypatch.setattr(CanonicalFold, "_remember_staged", computed)
    first = _step_digest(kind, 11, uploads=False)
    assert served["computed"] > 0  # chunked trials staged rows
    for k in served:
        served[k] = 0
    assert _step_digest(kind, 11, uploads=False) == first
    assert served["computed"] == 0 and served["sequence"] > 0
    planted = 0
    for key, entry in canonical._TRANSITIONS.items():  # plant: every recorded index copy reads its rows reversed
        if key[0] == "sequence" and entry[6] is not None and entry[6][0] == "index" and entry[6][1].shape[1] > 1:
            index = entry[6][1].clone()
            index[0] = index[0].flip(0)
            canonical._TRANSITIONS[key] = (*entry[:6], ("index", index), entry[7])
            planted += 1
    assert planted
    assert _step_digest(kind, 11, uploads=False) != first
    canonical.clear_plan_caches()


def test_chunked_bench_step_replays_every_call() -> None:
    """The fold_plan bench's chunked step (16384 rows, every sample in three calls): the next fold of the step
    replays all three calls, with the descriptors and staged rows of the computed fold."""
    canonical.clear_plan_caches()
    case = next(c for c in cases(False) if c.name == "chunked")
    lengths = [int(n) for n in case.lengths]
    cuts = [_thirds(n) for n in lengths]
    calls = [[(s, sum(c[:k]), c[k]) for s, c in enumerate(cuts) if c[k] > 0] for k in range(3)]
    got = []
    for _ in range(2):
        d = _Digest()
        fold = CanonicalFold(torch.zeros(2), lengths, 64)
        for k, call in enumerate(calls):
            rows = _as_packed(call)
            _add_tile_step(d, fold, rows, _tensors(rows, k))
        assert fold.done
        got.append(d.hex())
    assert got[0] == got[1]
    assert sum(key[0] == "sequence" for key in canonical._TRANSITIONS) == 3  # recorded once, then replayed
    canonical.clear_plan_caches()


def test_transition_cache_is_bounded_by_entries_and_index_bytes(monkeypatch) -> None:
    """Cached transitions are dropped least recently used first: past TRANSITION_SLOTS entries, or past
    TRANSITION_BYTES of cached staging indices (the newest entry stays whatever its size)."""
    canonical.clear_plan_caches()
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 3)
    monkeypatch.setattr(canonical, "TRANSITION_BYTES", 1000)
    for k in range(5):
        canonical._store_transition(("k", k), (k,))
    assert list(canonical._TRANSITIONS) == [("k", 2), ("k", 3), ("k", 4)]
    canonical._store_transition(("i", 0), (0,), 600)
    assert list(canonical._TRANSITIONS) == [("k", 3), ("k", 4), ("i", 0)]
    canonical._store_transition(("i", 1), (1,), 600)  # 1200 bytes held: the oldest go until under the bound
    assert list(canonical._TRANSITIONS) == [("i", 1)] and canonical._TRANSITION_NBYTES == {("i", 1): 600}
    canonical._store_transition(("i", 2), (2,), 5000)
    assert list(canonical._TRANSITIONS) == [("i", 2)]
    canonical.clear_plan_caches()
    assert not canonical._TRANSITIONS and not canonical._TRANSITION_NBYTES


if __name__ == "__main__":  # print the digests (to record them after a deliberate change of the plans)
    for name, fn in DIGESTS.items():
        print(f'    "{name}": "{fn()}",')


def test_packed_fast_path_equals_the_array_path() -> None:
    """``RowIdentity.packed`` merges a few pieces given as lists in one Python pass; given as arrays (or too many
    pieces) it takes the numpy path. Both must give the same runs, rows and errors for any pieces: empty and
    continuing pieces, repeated samples, a negative length (the general checks), a negative sample id."""
    rng = np.random.default_rng(23)
    for _ in range(300):
        k = int(rng.integers(0, 12))
        lengths = rng.integers(0, 6, size=k)
        if k and rng.random() < 0.5:
            lengths[rng.integers(0, k)] = 0
        ids = rng.integers(0, 3, size=k)
        starts = rng.integers(0, 8, size=k)
        if k and rng.random() < 0.3:  # a piece that continues the previous one (merged into one run)
            i = int(rng.integers(1, k)) if k > 1 else 0
            if i:
                ids[i], starts[i] = ids[i - 1], starts[i - 1] + lengths[i - 1]
        if k and rng.random() < 0.05:
            lengths[rng.integers(0, k)] = -1
        if k and rng.random() < 0.05:
            ids[rng.integers(0, k)] = -2
        outcomes = []
        for args in ((lengths.tolist(), ids.tolist(), starts.tolist()), (lengths, ids, starts)):
            try:
                rows = RowIdentity.packed(*args)
                r = rows.runs
                outcomes.append(("ok", rows.num_rows, rows.sample.tolist(), rows.position.tolist(),
                                 r.sample.tolist(), r.pos0.tolist(), r.row0.tolist(), r.length.tolist(), r.total))
            except ValueError as exc:
                outcomes.append(("error", str(exc)))
        assert outcomes[0] == outcomes[1], (lengths, ids, starts, outcomes)


def test_whole_step_closed_form_equals_the_general_plan(monkeypatch, no_replay):
    """One call holding every sample whole (any sample order, pads between samples, empty samples) takes the
    closed form ``_Layout.whole_step``; with it switched off, the general registration gives the same descriptors,
    rows and fold state. Calls that are not a whole step (a sample missing, twice, or cut) never take it."""
    taken = []
    real = canonical._Layout.whole_step

    def spy(self, runs):
        out = real(self, runs)
        taken.append(out is not None)
        return out

    def steps() -> str:
        d = _Digest()
        rng = np.random.default_rng(17)
        for trial in range(40):
            lengths, tile = _lengths(rng), int(rng.choice(TILES))
            call = [(s, 0, n) for s, n in enumerate(lengths) if n]
            rng.shuffle(call)
            rows = _as_runs(rng, call) if trial % 2 else _as_packed(call)
            fold = CanonicalFold(torch.zeros(2), lengths, tile)
            _add_tile_step(d, fold, rows, _tensors(rows, trial))
            d.add(fold.done, fold._lo, fold._hi)
        return d.hex()

    monkeypatch.setattr(canonical._Layout, "whole_step", spy)
    fast = steps()
    assert sum(taken) >= 30  # (a trial whose samples are all empty has no whole step)
    monkeypatch.setattr(canonical._Layout, "whole_step", lambda self, runs: None)
    assert steps() == fast
    monkeypatch.setattr(canonical._Layout, "whole_step", spy)
    taken.clear()
    lengths = [5, 3, 4]
    for pieces in ([(0, 0, 5), (1, 0, 3)], [(0, 0, 5), (0, 0, 5), (2, 0, 4)], [(0, 0, 5), (1, 0, 2), (2, 0, 4)],
                   [(0, 0, 5), (1, 1, 2), (2, 0, 4)]):
        try:
            CanonicalFold(torch.zeros(2), lengths, 2).take_tiles(_as_packed(pieces), ())
        except ValueError:
            pass
    assert not any(taken) and len(taken) == 4


def test_device_positions_are_cached_by_content(monkeypatch):
    """Positions of rows given by runs are cached by (rows, runs) content: the same packing gives the same tensor
    (equal to ``rows.position``), another packing, another row count or per-row identities never share it; the
    cache is bounded and cleared with the plan caches."""
    monkeypatch.setattr(canonical, "_cache_positions", lambda device: True)
    canonical.clear_plan_caches()
    cpu = torch.device("cpu")
    a = canonical.device_positions(RowIdentity.packed([3, 4], [0, 1], [0, 2]), cpu)
    b = canonical.device_positions(RowIdentity.packed([3, 4], [0, 1], [0, 2]), cpu)
    assert a is b and a.tolist() == [0, 1, 2, 2, 3, 4, 5]
    c = canonical.device_positions(RowIdentity.packed([3, 4], [0, 1], [0, 1]), cpu)
    assert c is not a and c.tolist() == [0, 1, 2, 1, 2, 3, 4]
    padded = RowIdentity.from_runs(9, [0, 1], [0, 2], [0, 5], [3, 4])
    d = canonical.device_positions(padded, cpu)
    assert d is not a and d.tolist() == [0, 1, 2, 0, 0, 2, 3, 4, 5]  # pad rows (3, 4) at position 0
    plain = RowIdentity(torch.tensor([0, 0, -1]), torch.tensor([4, 5, 7]))
    assert canonical.device_positions(plain, cpu).tolist() == [4, 5, 7]  # per-row identities: as given
    for n in range(canonical.POSITION_SLOTS + 5):
        canonical.device_positions(RowIdentity.packed([n + 1]), cpu)
    assert len(canonical._POSITIONS) == canonical.POSITION_SLOTS
    canonical.clear_plan_caches()
    assert not canonical._POSITIONS
    monkeypatch.setattr(canonical, "POSITION_BYTES", 8 * 100)  # bounded by bytes too: 100 positions
    for n in (40, 50, 30):
        canonical.device_positions(RowIdentity.packed([n]), cpu)
    assert [t.numel() for t in canonical._POSITIONS.values()] == [50, 30]  # the oldest went first
    canonical.device_positions(RowIdentity.packed([500]), cpu)
    assert [t.numel() for t in canonical._POSITIONS.values()] == [500]  # the newest stays, whatever its size
    canonical.clear_plan_caches()
