"""The canonical accumulation protocol: token reductions folded in one fixed order.

Any reduction over tokens (dweight of a norm, dW of a GEMM, embedding dweight) is done by the
kernel itself as a fold in *canonical* order: tokens ordered by (sample_id, position), grouped
in tiles of ``tile`` tokens aligned to each sample's start (absent rows of a sample's last tile
are zero rows), each tile reduced in a fixed order, tiles folded one after another into an FP32
main-grad accumulator that the kernel loads before its loop.

``CanonicalFold`` is the state that makes this independent of how tokens reach the kernel: each
call's rows are registered, the tiles that are complete and next in canonical order are handed to
the kernel, and the rows of every other tile are carried to a later call. A B=N call, N B=1 calls,
chunked, padded or permuted calls, even calls in reverse order, all fold the same tiles in the
same order into the same accumulator, so they give the same bits.

Why plans cost O(tiles), not O(rows) (issue 13): a call's rows are described by *runs* (rows
``row0 .. row0+n-1`` hold positions ``pos0 ..`` of one sample), given in closed form by
``RowIdentity.packed`` / ``from_runs`` or found once per RowIdentity with a few vectorised passes.
The fold keeps the received tokens as merged slot intervals, so registering a call, finding the
complete tiles and describing them costs O(runs + tiles). A ready tile is *direct* when one run of
this call holds all its rows (one ``(row0, count)`` descriptor, read in place), else *staged*: its
rows are copied, in slot order, into a staging block of the fold (carried rows wait there too).
``take_tiles`` hands kernels these descriptors; ``take`` still gives the row-index table of before.

Where ``gradsweep._fold_plan`` was built (csrc/host/fold_plan.cpp, the host compiler only), a call's planning, a
step's layout and a packed call's runs run there in one pass; elsewhere in numpy. Both give the same values in
the same order (tests/test_fold_plan_native.py): numpy's per-operation cost on ~100-element arrays was most of a
cold call's host time (issue 13).

Kernel-side infrastructure: kernels and their autograd Functions import this; it imports no
harness code. Launch a step's kernels before the fold's next take (staging blocks are reused then).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import torch

from gradsweep.uploads import upload, upload_parts

# A family's staging copy by pieces: (pieces [P, 3] int32 on the device: source row, staging row, length; the source
# row tensor; its staging tensor; the longest piece's length) -> None, every piece's rows copied source -> staging.
PieceCopy = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], None]

try:  # the compiled planner (csrc/host/fold_plan.cpp): the numpy path's plans, without numpy's per-call cost
    from gradsweep import _fold_plan as _native_plan
except ImportError:  # no C++ compiler at install: the numpy path (the same plans)
    _native_plan = None


def planner() -> str:
    """Which planner folds plan with in this process: ``"compiled"`` (gradsweep._fold_plan) or ``"numpy"``. Host
    timings of the plan record it (the two give the same plans at different host cost)."""
    return "numpy" if _native_plan is None else "compiled"


@dataclass(frozen=True)
class Runs:
    """Runs of a call's real rows: rows ``row0[i] .. row0[i]+length[i]-1`` hold positions ``pos0[i] ..`` of
    ``sample[i]`` (int64 numpy arrays, runs of length >= 1, no pad / filler rows)."""

    sample: np.ndarray
    pos0: np.ndarray
    row0: np.ndarray
    length: np.ndarray

    @property
    def num_runs(self) -> int:
        return len(self.sample)

    @cached_property
    def total(self) -> int:
        """Real rows in the runs."""
        return int(self.length.sum())

    @cached_property
    def key(self) -> bytes:
        """The runs' content as one bytes string: equal keys, equal rows (what content-keyed plan caches use)."""
        return b"".join(np.ascontiguousarray(a, dtype=np.int64).tobytes()
                        for a in (self.sample, self.pos0, self.row0, self.length))


def _maximal(sample: np.ndarray, pos0: np.ndarray, row0: np.ndarray, length: np.ndarray) -> Runs:
    """Drop empty runs and merge a run into the previous one when it continues it (same sample, next
    position, next row): one run per contiguous stretch, so a tile inside it is read in place."""
    keep = length > 0
    if not keep.all() or not len(sample) == len(pos0) == len(row0) == len(length):  # (refuses unequal lengths)
        sample, pos0, row0, length = sample[keep], pos0[keep], row0[keep], length[keep]
    if len(sample) > 1:
        end = row0[:-1] + length[:-1]
        shift = pos0 - row0  # a continuation keeps the sample and the position - row shift, and starts at the end
        cont = (sample[1:] == sample[:-1]) & (shift[1:] == shift[:-1]) & (row0[1:] == end)
        if cont.any():
            first = np.flatnonzero(np.concatenate(([True], ~cont)))
            ends = np.concatenate([first[1:], [len(sample)]])
            total = np.cumsum(np.concatenate([[0], length]))
            sample, pos0, row0 = sample[first], pos0[first], row0[first]
            length = total[ends] - total[first]
    return Runs(sample, pos0, row0, length)


def _rows_of_runs(n_rows: int, runs: Runs) -> tuple[np.ndarray, np.ndarray]:
    """Sample id and position of every row (-1 and 0 for the rows outside the runs)."""
    if runs.total == n_rows:  # no pad rows: the runs tile the rows (vectorised)
        order = np.argsort(runs.row0, kind="stable")
        n_o = runs.length[order]
        s = np.repeat(runs.sample[order], n_o)
        p = np.arange(n_rows, dtype=np.int64) + np.repeat(runs.pos0[order] - runs.row0[order], n_o)
        return s, p
    s = np.full(n_rows, -1, dtype=np.int64)
    p = np.zeros(n_rows, dtype=np.int64)
    for s_i, p_i, r_i, n_i in zip(*(a.tolist() for a in (runs.sample, runs.pos0, runs.row0, runs.length))):
        s[r_i:r_i + n_i] = s_i  # O(runs) slices
        p[r_i:r_i + n_i] = np.arange(p_i, p_i + n_i)
    return s, p


def _int64(a: Sequence[int] | np.ndarray | torch.Tensor) -> np.ndarray:
    """A fresh flat int64 array of ``a`` (a list, tuple, array, tensor or any iterable of ints)."""
    seq = a if isinstance(a, (list, tuple, np.ndarray, torch.Tensor)) else list(a)
    return np.array(seq, dtype=np.int64).reshape(-1)


@dataclass(frozen=True)
class RowIdentity:
    """Logical identity of every physical row of one call.

    ``sample[r]`` is the logical sample id of row r (negative for a pad or filler row) and ``position[r]``
    its position inside that sample. Both are int64 CPU tensors of the same length. ``runs`` describes
    the real rows compactly (computed once, cached; given directly by ``packed`` / ``from_runs``).
    """

    sample: torch.Tensor
    position: torch.Tensor

    def __post_init__(self) -> None:
        if self.sample.shape != self.position.shape or self.sample.dim() != 1:
            raise ValueError("RowIdentity: sample and position must be 1-D and of equal length")

    @property
    def num_rows(self) -> int:
        return int(self.sample.numel())

    @cached_property
    def runs(self) -> Runs:
        """Maximal runs of consecutive positions of one real sample on consecutive rows (vectorised, once)."""
        s = self.sample.cpu().numpy().astype(np.int64, copy=False)
        p = self.position.cpu().numpy().astype(np.int64, copy=False)
        n = len(s)
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return Runs(empty, empty, empty, empty)
        starts = np.flatnonzero(np.concatenate([[True], (s[1:] != s[:-1]) | (p[1:] != p[:-1] + 1)]))
        length = np.diff(np.concatenate([starts, [n]]))
        real = s[starts] >= 0
        return Runs(s[starts][real], p[starts][real], starts[real].astype(np.int64), length[real])

    @staticmethod
    def from_runs(n_rows: int, sample: Sequence[int], pos0: Sequence[int], row0: Sequence[int],
                  length: Sequence[int]) -> RowIdentity:
        """Rows described by runs (sample ids >= 0); every row outside the runs is a pad (sample -1)."""
        runs = _maximal(*(_int64(a) for a in (sample, pos0, row0, length)))
        end = runs.row0 + runs.length
        if len(runs.sample) and (int(runs.sample.min()) < 0 or int(runs.row0.min()) < 0 or int(end.max()) > n_rows):
            raise ValueError("RowIdentity.from_runs: runs must hold sample ids >= 0 and lie inside the rows")
        if len(runs.sample) > 1 and not (runs.row0[1:] >= end[:-1]).all():  # not in row order: sort, then check
            order = np.argsort(runs.row0, kind="stable")
            if (end[order[:-1]] > runs.row0[order[1:]]).any():
                raise ValueError("RowIdentity.from_runs: two runs share a row")
        return _RunRows(n_rows, runs)

    @staticmethod
    def packed(lengths: Sequence[int], sample_ids: Sequence[int] | None = None,
               starts: Sequence[int] | None = None) -> RowIdentity:
        """Rows of samples packed one after another (``starts`` gives each piece's first position)."""
        small = _packed_runs_small(lengths, sample_ids, starts)
        if small is not None:
            return small
        n = _int64(lengths)
        ids = np.arange(len(n), dtype=np.int64) if sample_ids is None else _int64(sample_ids)
        firsts = np.zeros(len(n), dtype=np.int64) if starts is None else _int64(starts)
        ends = np.cumsum(n)
        if len(n) and int(n.min()) < 0:  # a negative length moves later pieces back: the general checks
            return RowIdentity.from_runs(int(n.sum()), ids, firsts, ends - n, n)
        # pieces lie one after another inside the rows by construction: only the sample ids need a check
        runs = _maximal(ids, firsts, ends - n, n)
        if len(runs.sample) and int(runs.sample.min()) < 0:
            raise ValueError("RowIdentity.from_runs: runs must hold sample ids >= 0 and lie inside the rows")
        n_rows = int(ends[-1]) if len(n) else 0
        runs.__dict__["total"] = n_rows  # the cached_property's slot: no pad rows in a packed call
        return _RunRows(n_rows, runs)


_SMALL_PIECES = 256  # up to this many pieces, ``packed`` merges its runs in Python (numpy's per-call cost dominates)


def _packed_runs_small(lengths, sample_ids, starts) -> RowIdentity | None:
    """``packed`` for a few pieces given as lists or tuples: the runs of ``_maximal`` built in one Python pass
    (a trainer calls it once per call per step; the numpy path costs ~20 small array operations). None where the
    general path must run (other input types, many pieces, a negative length)."""
    if not isinstance(lengths, (list, tuple)) or len(lengths) > _SMALL_PIECES:
        return None
    count = len(lengths)
    ids = range(count) if sample_ids is None else sample_ids
    firsts = (0,) * count if starts is None else starts
    if not isinstance(ids, (range, list, tuple)) or not isinstance(firsts, (list, tuple)):
        return None
    if len(ids) != count or len(firsts) != count:
        raise ValueError("RowIdentity.packed: lengths, sample_ids and starts must have equal lengths")
    if _native_plan is not None:
        try:
            got = _native_plan.packed_runs(lengths, () if sample_ids is None else ids, () if starts is None else firsts)
        except TypeError:  # a value the compiled path does not take as an int (a float, say): the Python loop
            pass
        else:
            return None if got is None else _packed_rows(*got)
    out_s: list[int] = []
    out_p: list[int] = []
    out_r: list[int] = []
    out_n: list[int] = []
    row = 0
    for length, sid, first in zip(lengths, ids, firsts):
        length, sid, first = int(length), int(sid), int(first)
        if length < 0:
            return None
        if length == 0:
            continue
        if sid < 0:
            raise ValueError("RowIdentity.from_runs: runs must hold sample ids >= 0 and lie inside the rows")
        if out_s and out_s[-1] == sid and out_p[-1] + out_n[-1] == first and out_r[-1] + out_n[-1] == row:
            out_n[-1] += length  # continues the previous run: same sample, next position, next row
        else:
            out_s.append(sid)
            out_p.append(first)
            out_r.append(row)
            out_n.append(length)
        row += length
    return _packed_rows(np.array((out_s, out_p, out_r, out_n), dtype=np.int64), row)


def _packed_rows(table: np.ndarray, rows: int) -> RowIdentity:
    """Rows of packed runs given as one [4, runs] int64 table (sample, pos0, row0, length: its rows are the runs'
    fields) covering ``rows`` rows with no pad row."""
    runs = Runs(*table)
    runs.__dict__.update(total=rows, key=table.tobytes())  # the cached_properties' slots (no pad rows here)
    return _RunRows(rows, runs)


class _RunRows(RowIdentity):
    """A RowIdentity given by its runs (``from_runs`` / ``packed``). The fold needs only the runs, so the per-row
    tensors, O(rows) to build, are built on first use (the same values as ever)."""

    def __init__(self, n_rows: int, runs: Runs) -> None:  # the fields are the properties below
        self.__dict__.update(_n_rows=n_rows, runs=runs)

    @cached_property
    def _rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        s, p = _rows_of_runs(self._n_rows, self.runs)
        return torch.from_numpy(s), torch.from_numpy(p)

    @property  # type: ignore[override]
    def sample(self) -> torch.Tensor:
        return self._rows[0]

    @property  # type: ignore[override]
    def position(self) -> torch.Tensor:
        return self._rows[1]

    @property
    def num_rows(self) -> int:
        return self._n_rows


@dataclass(frozen=True)
class FoldStep:
    """The tiles one kernel launch must fold now, as a row-index table (``CanonicalFold.take``).

    ``plan[t, j]`` indexes a row of the fold's row space (``-1``: a zero row); tile t of the plan is
    canonical tile ``first_tile + t``. The row space is the first ``n_stage`` rows of the staging tensors
    ``stage`` (carried rows of earlier calls), then the call's own tensors ``call``: row ``r < n_stage`` is
    ``stage[i][r]``, row ``r >= n_stage`` is ``call[i][r - n_stage]``. A kernel that takes both bases reads
    the carried rows in place beside the call's; ``tensors`` concatenates them (a device copy of every
    row of the call) for one that takes one tensor.
    """

    plan: torch.Tensor
    call: tuple[torch.Tensor, ...]
    first_tile: int
    stage: tuple[torch.Tensor, ...] = ()
    n_stage: int = 0

    @property
    def num_tiles(self) -> int:
        return int(self.plan.shape[0])

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The row space as one tensor per row tensor: the carried rows, then the call's (a copy when any
        were carried; the call's own tensors when none were)."""
        if not self.n_stage:
            return self.call
        return tuple(torch.cat([st, t]) for st, t in zip(self.stage, self.call))

    @property
    def bases(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """(staging, call) per row tensor, for a kernel that reads the carried rows in place: the staging
        tensor is the call's own when nothing was carried (``n_stage`` 0: no plan entry reads it)."""
        stage = self.stage if self.n_stage else self.call
        return tuple(zip(stage, self.call))


@dataclass(frozen=True)
class TileStep:
    """The tiles one kernel launch must fold now, as descriptors (``CanonicalFold.take_tiles``).

    ``desc[t] = (row0, count)`` (int32, on the tensors' device) describes canonical tile
    ``first_tile + t``: its slots ``0 .. count-1`` are rows ``row0 ..`` of the call's tensors when
    ``row0 >= 0``, else rows ``-row0-1 ..`` of the staging tensors ``stage``; slots ``count .. tile-1``
    are zero rows (a sample's last tile). ``host_desc`` is the same on the host. ``stage`` holds one
    staging tensor per row tensor (the call's own tensors when nothing is staged, so that a kernel can
    always take both pointers); ``stage_rows`` bounds the staging rows the ready tiles use.
    """

    desc: torch.Tensor
    host_desc: np.ndarray
    stage: tuple[torch.Tensor, ...]
    stage_rows: int
    first_tile: int
    tile: int
    in_place_rows: int = -1  # rows of the call the direct tiles read (-1: not counted)

    @property
    def num_tiles(self) -> int:
        return int(self.host_desc.shape[0])

    @property
    def staged(self) -> bool:
        """Whether a ready tile reads the staging tensors."""
        return bool(self.num_tiles) and bool((self.host_desc[:, 0] < 0).any())

    def direct_rows(self) -> tuple[np.ndarray, np.ndarray]:
        """(row0, count) of the ready tiles read in place from the call's tensors."""
        d = self.host_desc
        own = d[:, 0] >= 0
        return d[own, 0].astype(np.int64), d[own, 1].astype(np.int64)

    def covers(self, n_rows: int) -> bool:
        """Whether the direct tiles read every one of the call's ``n_rows`` rows (then no row is left over)."""
        return self.in_place_rows == n_rows


def _frozen(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)  # shared by every fold of a layout (and every replayed transition)
    return a


class _Layout:
    """What the canonical tile sequence of a step is, given its sample lengths and tile (read-only arrays).

    slot of (sample s, position p) = (tile_base[s] + p // tile) * tile + p % tile = ``slot_base[s] + p``;
    ``[lo, hi)`` are the absent slots of every sample's last tile, received from the start so that "tile t
    complete" is "[t*tile, (t+1)*tile) received"; ``expected[t]`` the real rows of tile t, which are slots
    ``tile_first[t] ..``. Built with a few O(samples) numpy operations and the per-tile arrays on first use:
    a step's first fold pays the layout (issue 13's cold plan), so reductions and Python-level numpy wrappers
    (~1 us each on 13 samples, 3x a ufunc) are avoided.
    """

    def __init__(self, lengths: np.ndarray, tile: int) -> None:
        if _native_plan is not None:  # every array in one pass (the per-tile ones too: O(tiles) in C++ is cheap)
            (tiles_per_sample, self.total_tiles, slot_base, slot_end, lo, hi, self.nonempty, tile_first,
             expected) = _native_plan.layout(lengths, tile)  # (refuses a negative length as below)
            self.lengths, self.tile = _frozen(lengths), tile
            self.tiles_per_sample = _frozen(tiles_per_sample)
            self.slot_base, self.slot_end, self.lo, self.hi = map(_frozen, (slot_base, slot_end, lo, hi))
            self.__dict__.update(tile_first=_frozen(tile_first), expected=_frozen(expected))  # the cached slots
            return
        if np.count_nonzero(lengths < 0):
            raise ValueError("CanonicalFold: sample lengths must be >= 0")
        self.lengths, self.tile = _frozen(lengths), tile
        tiles_per_sample = (lengths + (tile - 1)) // tile
        ends = np.add.accumulate(tiles_per_sample) * tile  # (np.cumsum: 4x the time on a few samples)
        self.tiles_per_sample = tiles_per_sample
        self.total_tiles = int(ends[-1]) // tile if len(ends) else 0
        self.slot_base = _frozen(ends - tiles_per_sample * tile)
        self.slot_end = _frozen(self.slot_base + lengths)
        gap = self.slot_end < ends
        self.lo, self.hi = _frozen(self.slot_end[gap]), _frozen(ends[gap])
        self.nonempty = int(np.count_nonzero(tiles_per_sample))

    @cached_property
    def tile_first(self) -> np.ndarray:
        return _frozen(np.arange(0, self.total_tiles * self.tile, self.tile, dtype=np.int64))

    @cached_property
    def received_all(self) -> tuple[np.ndarray, np.ndarray]:
        """The received slots once every tile is: one interval (a whole step's state after its call)."""
        return _frozen(np.zeros(1, dtype=np.int64)), _frozen(np.full(1, self.total_tiles * self.tile, dtype=np.int64))

    @cached_property
    def expected(self) -> np.ndarray:
        last = self.slot_end.repeat(self.tiles_per_sample)  # the end of each tile's sample
        return _frozen(np.minimum(last - self.tile_first, self.tile))

    def whole_step(self, runs: Runs) -> np.ndarray | None:
        """Closed form of the commonest step, one call holding every sample whole (a packed batch, in any sample
        order, any row order): row0 of every tile, all read in place; None for any other call. Equal to what
        registering the runs and describing the tiles gives (tests/test_canonical_plan_speed_equivalence.py)."""
        if _native_plan is not None:
            return _native_plan.whole_step(runs.sample, runs.pos0, runs.row0, runs.length, self.lengths,
                                           self.slot_base, self.tiles_per_sample, self.tile, self.total_tiles,
                                           self.nonempty)
        s = runs.sample
        if len(s) != self.nonempty or not self.total_tiles or np.count_nonzero(runs.pos0):
            return None
        try:
            if np.count_nonzero(self.lengths[s] != runs.length):
                return None
        except IndexError:  # a sample id outside the step: the general path's error
            return None
        row_of = np.empty(len(self.lengths), dtype=np.int64)  # (an absent sample is empty: it has no tile)
        row_of[s] = runs.row0
        if np.count_nonzero(row_of[s] != runs.row0):  # a sample twice, another missing: the general path's error
            return None
        return (row_of - self.slot_base).repeat(self.tiles_per_sample) + self.tile_first


@lru_cache(maxsize=64)
def _layout(lengths_bytes: bytes, tile: int) -> _Layout:
    """The layout of one (lengths, tile): the same for every fold of a step's parameters, so built once."""
    return _Layout(np.frombuffer(lengths_bytes, dtype=np.int64), tile)


_TRANSITIONS: OrderedDict = OrderedDict()
TRANSITION_SLOTS = 512
TRANSITION_BYTES = 64 << 20  # device memory the cached staging indices may hold (the newest entry is kept)
_TRANSITION_NBYTES: dict = {}  # key -> bytes of device memory its entry holds (staging indices only)


def _evict_lru(cache: OrderedDict, nbytes: dict, slots: int, budget: int) -> None:
    """Drop least recently used entries while there are more than ``slots`` of them or they hold more than
    ``budget`` bytes of device memory (``nbytes``: key -> bytes, entries of no size absent); the newest entry
    stays whatever its size."""
    held = sum(nbytes.values())
    while cache and (len(cache) > slots or (held > budget and len(cache) > 1)):
        old, _ = cache.popitem(last=False)
        held -= nbytes.pop(old, 0)


def _store_transition(key: tuple, entry: tuple, nbytes: int = 0) -> None:
    """Cache a transition: at most TRANSITION_SLOTS entries and TRANSITION_BYTES of cached staging indices."""
    _TRANSITIONS[key] = entry
    _TRANSITIONS.move_to_end(key)
    _TRANSITION_NBYTES.pop(key, None)
    if nbytes:
        _TRANSITION_NBYTES[key] = nbytes
    _evict_lru(_TRANSITIONS, _TRANSITION_NBYTES, TRANSITION_SLOTS, TRANSITION_BYTES)


_POSITIONS: OrderedDict = OrderedDict()
POSITION_SLOTS = 32
POSITION_BYTES = 64 << 20  # device memory the cached positions may hold (the newest entry is kept whatever its size)


def _cache_positions(device: torch.device) -> bool:
    """Only device copies are cached (on the CPU the upload is the host tensor itself)."""
    return device.type == "cuda"


def device_positions(rows: RowIdentity, device: torch.device) -> torch.Tensor:
    """``rows.position`` on ``device`` (int64). On a GPU, rows given by runs (``packed`` / ``from_runs``, whose
    positions are a function of the runs) are cached by content: a step meets the same rows in every layer's
    RoPE (and a trainer's next step often too), and building O(rows) positions plus a pinned upload is then paid
    once. The returned tensor may be shared: read it, never write it."""
    if not _cache_positions(device) or not isinstance(rows, _RunRows):
        return upload(rows.position, device)
    key = (rows.num_rows, rows.runs.key, str(device))
    hit = _POSITIONS.get(key)
    if hit is not None:
        _POSITIONS.move_to_end(key)
        return hit
    out = _POSITIONS[key] = upload(rows.position, device)
    sizes = {k: t.numel() * t.element_size() for k, t in _POSITIONS.items()}
    _evict_lru(_POSITIONS, sizes, POSITION_SLOTS, POSITION_BYTES)
    return out


def clear_plan_caches() -> None:
    """Forget every cached layout, transition and position table (benchmarks of the cold plan; tests)."""
    _layout.cache_clear()
    _TRANSITIONS.clear()
    _TRANSITION_NBYTES.clear()
    _POSITIONS.clear()


class CanonicalFold:
    """FP32 main-grad accumulator plus the rows carried between calls, for one parameter gradient.

    ``sample_lengths`` names every logical sample of the step (ids 0..N-1): the canonical tile
    sequence is known in advance, so a tile is folded exactly when it is complete and every
    earlier tile has been folded.
    """

    def __init__(self, main_grad: torch.Tensor, sample_lengths: Sequence[int], tile: int) -> None:
        if main_grad.dtype != torch.float32 or not main_grad.is_contiguous():
            raise ValueError("CanonicalFold: main_grad must be a contiguous float32 tensor")
        if tile <= 0:
            raise ValueError(f"CanonicalFold: tile must be positive, got {tile}")
        lengths = _int64(sample_lengths)
        self.main_grad = main_grad
        self.tile = int(tile)
        self.lengths = lengths
        self._layout_key = (lengths.tobytes(), self.tile)
        layout = _layout(*self._layout_key)
        self.total_tiles = layout.total_tiles
        self._layout = layout
        self._slot_base, self._slot_end = layout.slot_base, layout.slot_end
        self._lo, self._hi = layout.lo, layout.hi
        self.cursor = 0
        # Staging: block b holds rows [b*tile, (b+1)*tile) of every staging tensor, in slot order.
        self._block_of_tile = np.empty(self.total_tiles, dtype=np.int64)
        self._block_of_tile.fill(-1)  # (np.full: 2x the time)
        self._free: list[int] = []
        self._stage_blocks = 0
        self._backing: tuple[torch.Tensor, ...] = ()  # one allocation per row tensor (see ``_grow_stage``)
        self._view: tuple[torch.Tensor, ...] = ()  # the staging tensors last made by ``_staging``
        self._path: tuple = ()  # the calls so far (see ``_follow``)

    @property
    def done(self) -> bool:
        """True once every canonical tile has been folded."""
        return self.cursor == self.total_tiles

    def expected_rows(self, first_tile: int, num_tiles: int) -> np.ndarray:
        """Real rows of canonical tiles ``first_tile ..`` (``tile`` except a sample's shorter last tile)."""
        return self._layout.expected[first_tile:first_tile + num_tiles]

    # ------------------------------------------------------------------------------------------ registration
    def _register(self, runs: Runs) -> tuple[np.ndarray, np.ndarray]:
        """Check the call's runs and add them to the received slots; return each run's (slot0, slot1)."""
        s, p = runs.sample, runs.pos0
        if not len(s):
            return s, s
        try:
            slot0 = self._slot_base[s] + p  # sample ids are >= 0 (runs hold real rows)
        except IndexError:
            raise ValueError(f"CanonicalFold: sample id {int(s.max())} outside the step's "
                             f"{len(self.lengths)} samples") from None
        slot1 = slot0 + runs.length
        if np.count_nonzero((p | (self._slot_end[s] - slot1)) < 0):  # p < 0 or past the sample's end
            raise ValueError("CanonicalFold: a row's position lies outside its sample")
        lo = np.concatenate((self._lo, slot0))
        hi = np.concatenate((self._hi, slot1))
        o = lo.argsort(kind="stable")
        lo, hi = lo[o], hi[o]
        # received intervals are disjoint: after sorting, any overlap (within the call or with earlier calls)
        # shows between neighbours
        space = lo[1:] - hi[:-1]
        if np.count_nonzero(space < 0):
            raise ValueError("CanonicalFold: a token reached the fold twice")
        gap = space.astype(bool)  # touching intervals merge
        self._lo, self._hi = np.concatenate((lo[:1], lo[1:][gap])), np.concatenate((hi[:-1][gap], hi[-1:]))
        return slot0, slot1

    def _advance(self) -> int:
        """The first incomplete tile at or after the cursor."""
        at = self.cursor * self.tile
        j = int(self._lo.searchsorted(at, side="right")) - 1
        hi = int(self._hi[j]) if j >= 0 else at
        return min(hi // self.tile, self.total_tiles) if hi > at else self.cursor

    # ------------------------------------------------------------------------------------ cached transitions
    # Every parameter of a step has its own fold, and every fold of one layout sees the same calls: the plan of
    # a call that stages nothing is a function of (layout, received slots, cursor, the call's runs) alone, so
    # it is computed (and uploaded) once and replayed for every other fold that meets the same state.
    def _transition_key(self, kind: str, runs: Runs, device: torch.device) -> tuple | None:
        """The cache key of this call from this state; None while staged rows wait (their blocks matter too)."""
        if len(self._free) != self._stage_blocks:
            return None
        return (kind, self._layout_key, self.cursor, self._lo.tobytes(), self._hi.tobytes(), runs.key, str(device))

    def _replay(self, key: tuple | None) -> tuple | None:
        """Apply a cached transition (the state after it, and its result), or None."""
        hit = _TRANSITIONS.get(key) if key is not None else None
        if hit is None:
            return None
        _TRANSITIONS.move_to_end(key)
        self._lo, self._hi, self.cursor = hit[0], hit[1], hit[2]
        return hit[3]

    def _remember(self, key: tuple | None, result: tuple) -> None:
        if key is None:
            return
        _frozen(self._lo)  # shared with every fold that replays this transition
        _frozen(self._hi)
        _store_transition(key, (self._lo, self._hi, self.cursor, result))

    # A call that stages or carries rows (or reads rows staged by an earlier call) also depends on the staging
    # blocks, which depend on every earlier call of the step. The fold's whole state is a function of its layout
    # and the sequence of calls it was given (runs, kind, whether it got row tensors; never the tensors' values),
    # so such a call is cached under that sequence: replaying it sets the state after it, grows this fold's own
    # staging tensors to the recorded capacity, runs the recorded staging copy on this call's tensors (the
    # uploaded index reused) and returns the recorded descriptors.
    def _follow(self, kind: str, runs: Runs, device: torch.device, tensors: tuple[torch.Tensor, ...]) -> tuple:
        """Extend the fold's call sequence by this call; return its cache key."""
        self._path = (self._path, kind, runs.key, str(device), len(tensors))
        return ("sequence", self._layout_key, self._path)

    def _replay_staged(self, key: tuple, tensors: tuple[torch.Tensor, ...]) -> tuple | None:
        hit = _TRANSITIONS.get(key)
        if hit is None:
            return None
        _TRANSITIONS.move_to_end(key)
        lo, hi, cursor, block_of_tile, free, blocks, copy, result = hit
        if blocks:
            self._grow_stage(tensors, blocks)
        if copy is not None:
            _run_stage_copy(self._backing, tensors, copy)
        self._lo, self._hi, self.cursor = lo, hi, cursor
        self._block_of_tile = block_of_tile.copy()
        self._free = list(free)
        return result

    def _remember_staged(self, key: tuple, copy: tuple | None, result: tuple) -> None:
        _frozen(self._lo)
        _frozen(self._hi)
        blocks = self._stage_blocks
        nbytes = copy[1].numel() * copy[1].element_size() if copy is not None and copy[0] == "index" else 0
        _store_transition(key, (self._lo, self._hi, self.cursor, self._block_of_tile.copy(), tuple(self._free),
                                blocks, copy, result), nbytes)

    # ----------------------------------------------------------------------------------------------- staging
    def _make_room(self, tensors: tuple[torch.Tensor, ...], blocks: int) -> None:
        """At least ``blocks`` staging blocks (the capacity doubled, contents kept; new blocks are free)."""
        if self._backing and blocks <= self._stage_blocks:
            return
        cap = max(blocks, 2 * self._stage_blocks, 4)
        self._free.extend(range(self._stage_blocks, cap))
        self._grow_stage(tensors, cap)

    def _grow_stage(self, tensors: tuple[torch.Tensor, ...], cap: int) -> None:
        """``cap`` staging blocks, contents kept (the free list is the caller's). The staging rows live in one
        allocation per row tensor, made with room for the next doubling (no more than the tiles left to fold):
        a chunked step's carried rows double from its first call to its second, so its fresh fold allocated its
        staging twice and copied it once per step (the bench's: 2x 85 MB more and 2x 42 MB copied; a torch.empty
        costs ~6 us of host on the H200). Copies write to the allocations; the staging tensors are their views."""
        if self._backing and cap <= self._stage_blocks:
            return
        if not self._backing or cap * self.tile > self._backing[0].shape[0]:
            room = max(cap, min(2 * cap, self.total_tiles - self.cursor)) * self.tile
            new = tuple(torch.empty((room, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in tensors)
            if self._backing:
                for dst, src in zip(new, self._staging()):
                    dst[: src.shape[0]].copy_(src)
            self._backing, self._view = new, ()
        self._stage_blocks = cap

    def _staging(self) -> tuple[torch.Tensor, ...]:
        """The staging tensors (``_stage_blocks`` blocks): views of the allocations, made only when a step hands
        them to a kernel (a view costs ~3 us of host on the H200), the allocations themselves when of that size."""
        rows = self._stage_blocks * self.tile
        if not self._view or self._view[0].shape[0] != rows:
            self._view = tuple(b if b.shape[0] == rows else b[:rows] for b in self._backing)
        return self._view

    def _stage_pieces(self, tensors: tuple[torch.Tensor, ...], piece_tile: np.ndarray, piece_lo: np.ndarray,
                      piece_row: np.ndarray, piece_len: np.ndarray) -> tuple | None:
        """Give the pieces' tiles their staging blocks (allocated on first use); return the copy to make as (source
        rows, staging rows, lengths) of the pieces (None: nothing to copy)."""
        if not len(piece_tile) or not tensors:
            return None
        tiles = _sorted_unique(piece_tile)
        fresh = tiles[self._block_of_tile[tiles] < 0]
        if len(fresh) > len(self._free):
            self._make_room(tensors, self._stage_blocks - len(self._free) + len(fresh))
        self._free.sort()
        self._block_of_tile[fresh] = self._free[:len(fresh)]  # lowest blocks first
        del self._free[:len(fresh)]
        dst0 = (self._block_of_tile[piece_tile] - piece_tile) * self.tile + piece_lo  # block * tile + lo % tile
        return piece_row, dst0, piece_len

    # ------------------------------------------------------------------------------------------------- takes
    def _check_tensors(self, rows: RowIdentity, tensors: tuple[torch.Tensor, ...]) -> None:
        n = rows.num_rows
        for t in tensors:
            if t.shape[0] != n:
                raise ValueError("CanonicalFold: every row tensor must have one row per RowIdentity row")
        if self._backing and (len(self._backing) != len(tensors) or any(
                s.dtype != t.dtype or s.shape[1:] != t.shape[1:] for s, t in zip(self._backing, tensors))):
            raise ValueError("CanonicalFold: calls must pass the same row tensors")

    def _pieces(self, slot0: np.ndarray, slot1: np.ndarray, row0: np.ndarray) -> np.ndarray:
        """Runs cut at tile boundaries: rows (tile, first slot, first row, length) of one [4, pieces] array (a
        subset of the pieces is one fancy index), O(runs + tiles)."""
        if not len(slot0):
            return np.empty((4, 0), dtype=np.int64)
        tile = self.tile
        t_first = slot0 // tile
        n_pieces = (slot1 + (tile - 1)) // tile - t_first
        ends = np.add.accumulate(n_pieces)
        # each piece's run: its slots, its row shift and its tile's shift from the piece index (one repeat)
        run_of = np.array((slot0, slot1, row0 - slot0, t_first - (ends - n_pieces))).repeat(n_pieces, axis=1)
        out = np.empty((4, int(ends[-1])), dtype=np.int64)
        piece_tile, piece_lo, piece_row, piece_len = out
        np.add(np.arange(out.shape[1]), run_of[3], out=piece_tile)
        np.multiply(piece_tile, tile, out=piece_row)  # (the first slot of the piece's tile, for now)
        np.minimum(run_of[1], piece_row + tile, out=piece_len)
        np.maximum(run_of[0], piece_row, out=piece_lo)
        piece_len -= piece_lo
        np.add(run_of[2], piece_lo, out=piece_row)
        return out

    def _release(self, c0: int, c1: int) -> np.ndarray:
        """Staging blocks of the ready tiles (-1: none), given back for the next call's carried rows."""
        blocks = self._block_of_tile[c0:c1].copy()
        if self._backing:
            self._free.extend(blocks[blocks >= 0].tolist())
            self._block_of_tile[c0:c1] = -1
        self.cursor = c1
        return blocks

    def take_tiles(self, rows: RowIdentity, tensors: Sequence[torch.Tensor],
                   stage_copy: PieceCopy | None = None) -> TileStep:
        """Register one call's rows (and the row tensors a fold reads); describe the tiles to fold now.

        ``stage_copy`` (a family's piece copy, ``PieceCopy``): the rows to stage go to the device as their pieces
        (source row, staging row, length) and that kernel copies them, one launch per row tensor; None: torch's
        ``index_select`` + ``index_copy_`` over an uploaded row index. Either way the same rows land in the same
        staging rows (a copy), so the fold's bits are the same."""
        tensors = tuple(tensors)
        self._check_tensors(rows, tensors)
        runs = rows.runs
        device = tensors[0].device if tensors else torch.device("cpu")
        c0, tile = self.cursor, self.tile
        key = self._transition_key("tiles", runs, device)
        seq = self._follow("tiles" if stage_copy is None else "tiles/pieces", runs, device, tensors)
        hit = self._replay(key)
        if hit is not None:
            return TileStep(hit[0], hit[1], tensors, 0, c0, tile, hit[2])
        hit = self._replay_staged(seq, tensors)
        if hit is not None:
            desc_dev, desc, stage_rows, in_place = hit
            stage = self._staging() if stage_rows else tensors
            return TileStep(desc_dev, desc, stage, stage_rows, c0, tile, in_place)
        if c0 == 0 and self._lo is self._layout.lo:  # nothing received yet: maybe the whole step in one call
            whole = self._layout.whole_step(runs)
            if whole is not None:
                return self._take_whole_step(whole, runs, tensors, key, device)
        desc_dev, desc, stage_rows, in_place, copy = self._plan_tiles(runs, tensors, device, stage_copy)
        stage = self._staging() if stage_rows else tensors
        step = TileStep(desc_dev, _frozen(desc), stage, stage_rows, c0, tile, in_place)
        if in_place == runs.total and key is not None:  # nothing staged, carried or waiting: keyed by the state
            self._remember(key, (step.desc, desc, in_place))
        else:
            self._remember_staged(seq, copy, (step.desc, desc, stage_rows, in_place))
        return step

    def _plan_tiles(self, runs: Runs, tensors: tuple[torch.Tensor, ...], device: torch.device,
                    stage_copy: PieceCopy | None = None) -> tuple[torch.Tensor, np.ndarray, int, int, tuple | None]:
        """Register the call, stage its rows that no ready tile reads in place, release the ready tiles; return
        their descriptors (on ``device`` and on the host), the staging rows they read, the rows read in place and
        the staging copy. The staging copy's row index and the descriptors go to the device in one upload
        (``upload_parts``: a pinned copy costs ~25 us of host on the H200, and a staged call needed two).

        A ready tile is direct when one piece (a run cut at tile boundaries) holds all its real rows: then nothing
        of it can have come from another call (that would be a duplicate). Every other piece is staged: its tile
        is split between runs or calls, or not ready. Planned by the compiled planner where it was built (one pass
        in C++, csrc/host/fold_plan.cpp), else in numpy (``_plan_host``): the same values in the same order
        (tests/test_fold_plan_native.py). The staging allocation, copy and uploads are torch's either way."""
        as_pieces = stage_copy is not None
        if _native_plan is None:
            desc, stage_rows, in_place, staged = self._plan_host(runs, tensors, as_pieces)
        else:
            desc, stage_rows, in_place, staged = self._planned(False, runs, tensors, as_pieces)
        if staged is not None and staged[0] == "index":  # the staging index and the descriptors in one copy
            index, desc_dev = upload_parts((staged[1], desc), device)
            copy = ("index", index)
        elif staged is not None and staged[0] == "pieces":  # the pieces and the descriptors in one copy
            pieces, desc_dev = upload_parts((staged[1], desc), device)
            copy = ("pieces", pieces, stage_copy, int(staged[1][:, 2].max()))
        else:  # nothing staged, or one slice (no index to upload)
            copy, desc_dev = staged, upload(desc, device)
        if copy is not None:
            _run_stage_copy(self._backing, tensors, copy)
        return desc_dev, desc, stage_rows, in_place, copy

    def _planned(self, table: bool, runs: Runs, tensors: tuple[torch.Tensor, ...], as_pieces: bool = False) -> tuple:
        """One call through the compiled planner (``take``'s row table, else ``take_tiles``' descriptors): the fold's
        new state taken from it (the staging grown to the capacity it asked for first, while the cursor still says
        which tiles are left), its plan returned. The block table is updated in place by the planner."""
        lo, hi, cursor, free, cap, plan = _native_plan.plan_call(
            table, runs.sample, runs.pos0, runs.row0, runs.length, self._slot_base, self._slot_end,
            self._layout.expected, self.tile, self.total_tiles, self._lo, self._hi, self.cursor, self._block_of_tile,
            self._free, self._stage_blocks, bool(tensors), as_pieces)
        if cap > self._stage_blocks:
            self._grow_stage(tensors, cap)
        self._lo, self._hi, self.cursor, self._free = lo, hi, cursor, free
        return plan

    def _plan_host(self, runs: Runs, tensors: tuple[torch.Tensor, ...],
                   as_pieces: bool = False) -> tuple[np.ndarray, int, int, tuple | None]:
        """The numpy planner (the compiled one's reference): the call registered, its staged rows given blocks,
        the ready tiles released; (descriptors, staging rows, rows read in place, the copy as ``("slice", dst,
        src, rows)`` or ``("index", [2, rows] host index)``, or None)."""
        c0 = self.cursor
        slot0, slot1 = self._register(runs)
        row0 = runs.row0
        c1 = self._advance()
        if c1 > c0 and len(slot0) > 1 and np.count_nonzero(slot0[1:] < slot0[:-1]):  # runs in slot order
            o = slot0.argsort()
            slot0, slot1, row0 = slot0[o], slot1[o], row0[o]
        pieces = self._pieces(slot0, slot1, row0)
        tile_of, _, row, length = pieces
        direct = (tile_of < c1) & (length == self._layout.expected[tile_of])
        staged = self._stage_pieces(tensors, *pieces[:, ~direct])
        if c1 == c0:
            desc, stage_rows, in_place = np.empty((0, 2), dtype=np.int32), 0, 0
        else:
            blocks = self._release(c0, c1)
            first = blocks * -self.tile - 1  # a split tile reads its staging block (rows -first-1 ..)
            d = direct.nonzero()[0]
            first[tile_of[d] - c0] = row[d]
            desc = np.empty((c1 - c0, 2), dtype=np.int32)
            desc[:, 0] = first
            desc[:, 1] = self._layout.expected[c0:c1]
            stage_rows = (int(blocks.max()) + 1) * self.tile  # (0 when no ready tile is staged: blocks are -1)
            in_place = int(length[d].sum())
        return desc, stage_rows, in_place, None if staged is None else _host_copy(*staged, as_pieces=as_pieces)

    def _take_whole_step(self, row0: np.ndarray, runs: Runs, tensors: tuple[torch.Tensor, ...], key: tuple | None,
                         device: torch.device) -> TileStep:
        """Every tile ready and read in place (``_Layout.whole_step``): every slot is received at once."""
        layout = self._layout
        desc = np.empty((layout.total_tiles, 2), dtype=np.int32)
        desc[:, 0] = row0
        desc[:, 1] = layout.expected
        self._lo, self._hi = layout.received_all
        self.cursor = layout.total_tiles
        step = TileStep(upload(desc, device), _frozen(desc), tensors, 0, 0, self.tile, runs.total)
        self._remember(key, (step.desc, desc, runs.total))
        return step

    def take(self, rows: RowIdentity, tensors: Sequence[torch.Tensor],
             stage_copy: PieceCopy | None = None) -> FoldStep:
        """Register one call's rows; return the tiles to fold now as a row-index table (see ``FoldStep``).

        Rows of this call are indexed in place (after the carried rows), as before ``take_tiles`` existed:
        only rows of tiles that stay incomplete are copied (carried). ``stage_copy``: as in ``take_tiles`` (the
        carried rows go to the device as their pieces, uploaded with the row table, and the family's kernel
        copies them; None: ``index_select`` + ``index_copy_`` over an uploaded row index, then the table's own
        upload, as before).
        """
        tensors = tuple(tensors)
        self._check_tensors(rows, tensors)
        runs = rows.runs
        device = tensors[0].device if tensors else torch.device("cpu")
        key = self._transition_key("rows", runs, device)
        seq = self._follow("rows" if stage_copy is None else "rows/pieces", runs, device, tensors)
        c0 = self.cursor
        hit = self._replay(key)
        if hit is not None:
            return FoldStep(hit, tensors, c0)
        hit = self._replay_staged(seq, tensors)
        if hit is not None:
            plan, n_stage = hit
            return FoldStep(plan, tensors, c0, *self._stage_rows(n_stage))
        as_pieces = stage_copy is not None
        if _native_plan is None:
            plan, n_stage, staged, all_ready = self._plan_table_host(runs, tensors, as_pieces)
        else:  # the compiled planner (see ``_plan_tiles``): the same table, the same uploads in the same order
            plan, n_stage, staged, all_ready = self._planned(True, runs, tensors, as_pieces)
        if staged is not None and staged[0] == "pieces":  # the pieces and the row table in one copy
            pieces, plan_dev = upload_parts((staged[1], plan), device)
            copy = ("pieces", pieces, stage_copy, int(staged[1][:, 2].max()))
        else:  # the row index (or one slice) first, then the table: the uploads of the index path
            copy = None if staged is None else _on_device(staged, device)
            plan_dev = None
        if copy is not None:
            _run_stage_copy(self._backing, tensors, copy)
        step = FoldStep(upload(plan, device) if plan_dev is None else plan_dev, tensors, c0, *self._stage_rows(n_stage))
        if all_ready and not n_stage and key is not None:  # nothing staged, carried or read from staging
            self._remember(key, step.plan)
        else:
            self._remember_staged(seq, copy, (step.plan, n_stage))
        return step

    def _plan_table_host(self, runs: Runs, tensors: tuple[torch.Tensor, ...],
                         as_pieces: bool = False) -> tuple[np.ndarray, int, tuple | None, bool]:
        """``take``'s numpy planner (the compiled one's reference): the call registered, the rows of tiles that stay
        incomplete given staging blocks, the ready tiles released; (their int32 row table, the staging rows it
        reads first, the copy to make in ``_host_copy``'s form, whether every piece was ready)."""
        c0 = self.cursor
        slot0, slot1 = self._register(runs)
        c1, tile = self._advance(), self.tile
        n_ready = c1 - c0
        piece_tile, piece_lo, piece_row, piece_len = self._pieces(slot0, slot1, runs.row0)
        ready = piece_tile < c1
        staged = self._stage_pieces(tensors, piece_tile[~ready], piece_lo[~ready], piece_row[~ready],
                                    piece_len[~ready])
        copy = None if staged is None else _host_copy(*staged, as_pieces=as_pieces)
        blocks = self._release(c0, c1)
        n_stage = int(blocks.max() + 1) * tile if n_ready and (blocks >= 0).any() else 0
        j = np.arange(tile)
        plan = np.where(blocks[:, None] >= 0, blocks[:, None] * tile + j[None, :], -1)
        total = int(piece_len[ready].sum())
        rel = np.arange(total) - np.repeat(np.cumsum(piece_len[ready]) - piece_len[ready], piece_len[ready])
        plan.reshape(-1)[np.repeat(piece_lo[ready] - c0 * tile, piece_len[ready]) + rel] = (
            n_stage + np.repeat(piece_row[ready], piece_len[ready]) + rel)
        plan[j[None, :] >= self.expected_rows(c0, n_ready)[:, None]] = -1
        return plan.astype(np.int32), n_stage, copy, bool(ready.all())

    def _stage_rows(self, n_stage: int) -> tuple[tuple[torch.Tensor, ...], int]:
        """A ``take`` step's staging part: the first ``n_stage`` rows of every staging tensor (views: a kernel
        launched before the next ``take`` reads them as they are now, in stream order), and ``n_stage``."""
        if not n_stage:
            return (), 0
        return tuple(st[:n_stage] for st in self._backing), n_stage

    def finish(self) -> torch.Tensor:
        """Check that every token was folded and return the main grad."""
        if not self.done:
            missing = int(self.total_tiles - self.cursor)
            raise ValueError(f"CanonicalFold: {missing} canonical tiles never completed: "
                             "some tokens of the step never reached the backward")
        return self.main_grad


def _sorted_unique(a: np.ndarray) -> np.ndarray:
    """``np.unique(a)``, without its sort when ``a`` is sorted already (pieces come in slot order)."""
    if len(a) < 2:
        return a
    step = a[1:] - a[:-1]
    if np.count_nonzero(step < 0):
        return np.unique(a)
    return np.concatenate((a[:1], a[1:][step.astype(bool)]))


def _host_copy(src0: np.ndarray, dst0: np.ndarray, length: np.ndarray, as_pieces: bool = False) -> tuple:
    """The copy stage[dst0[i] + j] = tensor[src0[i] + j] for j < length[i] (every staging tensor and its row
    tensor), on the host (the compiled planner returns the same forms): ``("slice", dst, src, rows)`` for one piece,
    else ``("index", [2, rows] row index)`` for ``index_select`` + ``index_copy_`` (one upload for every tensor;
    measured on the H200 host, slice copies of a chunked call's ~25 stretches through ``torch._foreach_copy_`` cost
    2x the index path, the slicing itself being ~2 us per view), or with ``as_pieces`` the pieces themselves,
    ``("pieces", [pieces, 3] int32)`` (source row, staging row, length), for a family's piece copy."""
    if len(length) == 1:  # one slice: no index upload
        return ("slice", int(dst0[0]), int(src0[0]), int(length[0]))
    if as_pieces:
        return ("pieces", np.stack((src0, dst0, length), axis=1).astype(np.int32))
    return ("index", _piece_rows(src0, dst0, length))


def _on_device(copy: tuple, device: torch.device) -> tuple:
    """A host-form copy (``_host_copy``) with its index uploaded."""
    return copy if copy[0] == "slice" else ("index", upload(copy[1], device))


def _run_stage_copy(stage: tuple[torch.Tensor, ...], tensors: tuple[torch.Tensor, ...], copy: tuple) -> None:
    if copy[0] == "slice":
        _, d, r, n = copy
        for st, t in zip(stage, tensors):
            st[d:d + n].copy_(t[r:r + n])
        return
    if copy[0] == "pieces":  # a family's piece copy: one launch per row tensor
        _, pieces, piece_copy, longest = copy
        for st, t in zip(stage, tensors):
            piece_copy(pieces, t, st, longest)
        return
    src, dst = copy[1].unbind(0)  # source rows, staging rows (H200 host: 3.2 us, two selects 4.3 us)
    for st, t in zip(stage, tensors):
        st.index_copy_(0, dst, t.index_select(0, src))


def _piece_rows(src0: np.ndarray, dst0: np.ndarray, length: np.ndarray) -> np.ndarray:
    """[2, rows] int64: the source and the staging row of every row of the pieces, in piece order (one pass)."""
    ends = np.add.accumulate(length)
    shift = ends - length  # piece i's rows are numbered shift[i] .. in the flat row order
    rows = np.array((src0 - shift, dst0 - shift)).repeat(length, axis=1)
    rows += np.arange(int(ends[-1]), dtype=np.int64)
    return rows


def fold_reference(step: FoldStep, contribution: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """Sequential fold of per-tile sums on the host (tests and the CPU path only).

    ``contribution[r]`` is row r's fp32 contribution; each tile is summed then added to ``acc``.
    """
    for t in range(step.num_tiles):
        idx = step.plan[t].long()
        rows = contribution[idx.clamp(min=0)] * (idx >= 0).to(contribution.dtype).view(
            -1, *([1] * (contribution.dim() - 1)))
        acc = acc + rows.sum(0)
    return acc
