"""The canonical accumulation protocol: token reductions folded in one fixed order.

Any reduction over tokens (dweight of a norm, dW of a GEMM, embedding dweight) is done by the
kernel itself as a fold in *canonical* order: tokens ordered by (sample_id, position), grouped
in tiles of ``tile`` tokens aligned to each sample's start (absent rows of a sample's last tile
are zero rows), each tile reduced in a fixed order, tiles folded one after another into an FP32
main-grad accumulator that the kernel loads before its loop.

``CanonicalFold`` is the state that makes this independent of how tokens reach the kernel: it
turns each call's physical rows into a *plan* (an int32 ``[n_tiles, tile]`` table of row
indices, ``-1`` for a zero row) covering only the tiles that are complete and next in canonical
order, and carries the rows of every other tile to a later call. A B=N call, N B=1 calls,
chunked, padded or permuted calls, even calls in reverse order, all fold the same tiles in the
same order into the same accumulator, so they give the same bits.

Kernel-side infrastructure: kernels and their autograd Functions import this; it imports no
harness code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class RowIdentity:
    """Logical identity of every physical row of one call.

    ``sample[r]`` is the logical sample id of row r (``-1`` for a pad row) and ``position[r]``
    its position inside that sample. Both are int64 CPU tensors of the same length.
    """

    sample: torch.Tensor
    position: torch.Tensor

    def __post_init__(self) -> None:
        if self.sample.shape != self.position.shape or self.sample.dim() != 1:
            raise ValueError("RowIdentity: sample and position must be 1-D and of equal length")

    @property
    def num_rows(self) -> int:
        return int(self.sample.numel())

    @staticmethod
    def packed(lengths: Sequence[int], sample_ids: Sequence[int] | None = None,
               starts: Sequence[int] | None = None) -> RowIdentity:
        """Rows of samples packed one after another (``starts`` gives each piece's first position)."""
        ids = list(range(len(lengths))) if sample_ids is None else list(sample_ids)
        firsts = [0] * len(lengths) if starts is None else list(starts)
        sample = torch.cat([torch.full((n,), s, dtype=torch.int64) for s, n in zip(ids, lengths)]
                           or [torch.zeros(0, dtype=torch.int64)])
        position = torch.cat([torch.arange(p, p + n, dtype=torch.int64)
                              for p, n in zip(firsts, lengths)]
                             or [torch.zeros(0, dtype=torch.int64)])
        return RowIdentity(sample, position)


@dataclass(frozen=True)
class FoldStep:
    """The tiles one kernel launch must fold now.

    ``plan[t, j]`` indexes a row of every tensor in ``tensors`` (``-1``: a zero row); tile t of
    the plan is canonical tile ``first_tile + t``. ``tensors`` are the caller's tensors when
    nothing was carried, else carried rows followed by the caller's rows.
    """

    plan: torch.Tensor
    tensors: tuple[torch.Tensor, ...]
    first_tile: int

    @property
    def num_tiles(self) -> int:
        return int(self.plan.shape[0])


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
        lengths = np.asarray(list(sample_lengths), dtype=np.int64)
        if (lengths < 0).any():
            raise ValueError("CanonicalFold: sample lengths must be >= 0")
        self.main_grad = main_grad
        self.tile = int(tile)
        self.lengths = lengths
        tiles_per_sample = (lengths + tile - 1) // tile
        self._tile_base = np.concatenate([[0], np.cumsum(tiles_per_sample)]).astype(np.int64)
        self.total_tiles = int(self._tile_base[-1])
        tile_sample = np.repeat(np.arange(len(lengths)), tiles_per_sample)
        tile_in_sample = np.arange(self.total_tiles) - self._tile_base[tile_sample]
        self._expected = np.minimum(tile, lengths[tile_sample] - tile_in_sample * tile)
        # slot of (sample s, position p) = (tile_base[s] + p // tile) * tile + p % tile = slot_base[s] + p
        self._slot_base = self._tile_base[:-1] * tile
        self._shift = tile.bit_length() - 1 if tile & (tile - 1) == 0 else None
        self._count = np.zeros(self.total_tiles, dtype=np.int64)
        self._seen = np.zeros(self.total_tiles * tile, dtype=bool)
        self.cursor = 0
        self._pending_slots = np.zeros(0, dtype=np.int64)
        self._pending: tuple[torch.Tensor, ...] | None = None

    @property
    def done(self) -> bool:
        """True once every canonical tile has been folded."""
        return self.cursor == self.total_tiles

    def _slots(self, rows: RowIdentity) -> tuple[np.ndarray, np.ndarray]:
        sample = rows.sample.cpu().numpy()
        position = rows.position.cpu().numpy()
        if len(sample) and int(sample.min()) >= 0:  # no pad rows: skip the gathers
            real, s, p = np.arange(len(sample)), sample, position
        else:
            real = np.flatnonzero(sample >= 0)
            s, p = sample[real], position[real]
        if len(s) and int(s.max()) >= len(self.lengths):
            raise ValueError(f"CanonicalFold: sample id {int(s.max())} outside the step's "
                             f"{len(self.lengths)} samples")
        if ((p < 0) | (p >= self.lengths[s])).any():
            raise ValueError("CanonicalFold: a row's position lies outside its sample")
        slots = self._slot_base[s] + p
        if len(slots):
            lo = int(slots.min())
            if self._seen[slots].any() or int(np.bincount(slots - lo).max()) > 1:
                raise ValueError("CanonicalFold: a token reached the fold twice")
        return real, slots

    def take(self, rows: RowIdentity, tensors: Sequence[torch.Tensor]) -> FoldStep:
        """Register one call's rows (and the row tensors a fold reads); return what to fold now."""
        tensors = tuple(tensors)
        if any(t.shape[0] != rows.num_rows for t in tensors):
            raise ValueError("CanonicalFold: every row tensor must have one row per RowIdentity row")
        if self._pending is not None and len(self._pending) != len(tensors):
            raise ValueError("CanonicalFold: calls must pass the same row tensors")
        real, slots = self._slots(rows)
        self._seen[slots] = True
        if len(slots):
            tiles = slots >> self._shift if self._shift is not None else slots // self.tile
            lo_tile = int(tiles.min())
            counts = np.bincount(tiles - lo_tile)
            self._count[lo_tile:lo_tile + len(counts)] += counts
        incomplete = np.nonzero(self._count[self.cursor:] != self._expected[self.cursor:])[0]
        new_cursor = self.cursor + int(incomplete[0]) if len(incomplete) else self.total_tiles

        n_pending = len(self._pending_slots)
        all_slots = np.concatenate([self._pending_slots, slots])
        all_rows = np.concatenate([np.arange(n_pending), n_pending + real]) if n_pending else real
        device = tensors[0].device if tensors else torch.device("cpu")
        if n_pending:
            pend = self._pending
            assert pend is not None
            source = tuple(torch.cat([p, t.to(p.dtype)]) for p, t in zip(pend, tensors))
        else:
            source = tensors
        row_index = all_rows if n_pending else real

        first_slot, end_slot = self.cursor * self.tile, new_cursor * self.tile
        ready = (all_slots >= first_slot) & (all_slots < end_slot)
        plan = np.full((new_cursor - self.cursor) * self.tile, -1, dtype=np.int32)
        plan[all_slots[ready] - first_slot] = row_index[ready]
        plan = plan.reshape(new_cursor - self.cursor, self.tile)

        keep = ~ready
        keep_rows = torch.as_tensor(row_index[keep], dtype=torch.int64, device=device)
        self._pending_slots = all_slots[keep]
        self._pending = tuple(t.index_select(0, keep_rows) for t in source) if keep.any() else None
        step = FoldStep(_to_device(plan, device), source, self.cursor)
        self.cursor = new_cursor
        return step

    def finish(self) -> torch.Tensor:
        """Check that every token was folded and return the main grad."""
        if not self.done:
            missing = int(self.total_tiles - self.cursor)
            raise ValueError(f"CanonicalFold: {missing} canonical tiles never completed: "
                             "some tokens of the step never reached the backward")
        return self.main_grad


def _to_device(plan: np.ndarray, device: torch.device) -> torch.Tensor:
    """Upload a plan without stalling the host behind queued GPU work (pinned, non-blocking copy)."""
    host = torch.from_numpy(plan)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


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
