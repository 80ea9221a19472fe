"""Deterministic sharding: sort the cell ids, give the i-th cell to shard (i mod N) + 1.

Every machine computes the same split from the same manifest and filters, so shards can be run
anywhere and merged back into exactly the unsharded set.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from gradsweep.errors import BadInput
from gradsweep.results import CellKey

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    @property
    def spec(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """'K/N' with 1 <= K <= N."""
    match = _SPEC.match(text)
    if not match:
        raise BadInput(f"--shard {text!r}: expected K/N, e.g. 1/4")
    k, n = int(match.group(1)), int(match.group(2))
    if n < 1 or not 1 <= k <= n:
        raise BadInput(f"--shard {text!r}: K must be between 1 and N (N >= 1), e.g. 1/{max(n, 1)}")
    return Shard(k, n)


def sorted_cells(cells: list[CellKey]) -> list[CellKey]:
    return sorted(cells, key=lambda c: c.id)


def select_shard(cells: list[CellKey], shard: Shard | None) -> list[CellKey]:
    """The cells of one shard, in sorted-id order."""
    ordered = sorted_cells(cells)
    if shard is None:
        return ordered
    return [c for i, c in enumerate(ordered) if i % shard.count == shard.index - 1]


def cells_digest(cells: list[CellKey]) -> str:
    """sha256 of the sorted cell ids: identifies the selection that shards must add up to."""
    text = "\n".join(c.id for c in sorted_cells(cells))
    return hashlib.sha256(text.encode()).hexdigest()
