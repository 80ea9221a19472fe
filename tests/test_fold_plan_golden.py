"""Fold plans pinned field by field (issue 13): every ``take_tiles`` / ``take`` result of a set of layouts equals
the one recorded in ``tests/data/fold_plan_golden.npz``.

The golden file was written by the planning code of before the cold-plan speed-up (``python
tests/test_fold_plan_golden.py`` at the branch point of ``wip/cold-plan``). Unlike the digests of
``test_canonical_plan_speed_equivalence.py``, a mismatch here names the layout, the call and the field that moved.

Layouts: packed, chunked in 2 and 3 calls, one call per sample, reversed call order, rows given by ``from_runs``
with pads and a permuted run order, rows given as explicit per-row sample / position tensors (scrambled, padded),
tiles 16 and 64, lengths of 1, of multiples of the tile and of 0. Each layout is planned cold (caches cleared)
and then again by a second fold of the same step (the replayed plan). Recorded per call: the descriptors (host
and device), first tile, tile, staging rows, rows read in place, whether the staging tensors are the call's own,
the rows every tile reads (from the call's tensors or the staging tensors), the cursor, every array uploaded
(the staging copies' row indices included); for ``take``: the row table and the rows it reads.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches
from tests.helpers import seeing_fold_uploads

GOLDEN = Path(__file__).parent / "data" / "fold_plan_golden.npz"

Piece = tuple[int, int, int]  # (sample, first position, rows)
Layout = tuple[list[int], int, list[list[Piece]], str]  # lengths, tile, calls, how rows are given

LENGTHS_A = [150, 5, 64, 1, 23, 37, 128, 17]
LENGTHS_B = [1, 1, 16, 33, 0, 48, 7, 96, 1]


def _thirds(n: int) -> list[int]:
    a = n // 3 + (1 if n > 8 else 0)
    b = (n - a) // 2
    return [a, b, n - a - b]


def _chunked(lengths: list[int], parts: int) -> list[list[Piece]]:
    """Every sample cut into ``parts`` pieces (off tile boundaries), piece k of every sample in call k."""
    calls: list[list[Piece]] = [[] for _ in range(parts)]
    for s, n in enumerate(lengths):
        cuts = _thirds(n) if parts == 3 else [n // 2, n - n // 2]
        first = 0
        for k, c in enumerate(cuts):
            if c:
                calls[k].append((s, first, c))
            first += c
    return [c for c in calls if c]


def _layouts() -> dict[str, Layout]:
    out: dict[str, Layout] = {}
    for lname, lengths in (("a", LENGTHS_A), ("b", LENGTHS_B)):
        whole = [(s, 0, n) for s, n in enumerate(lengths) if n]
        for tile in (16, 64):
            base = f"{lname}_t{tile}"
            out[f"{base}_packed"] = (lengths, tile, [whole], "packed")
            out[f"{base}_packed_reversed_samples"] = (lengths, tile, [whole[::-1]], "packed")
            out[f"{base}_chunked2"] = (lengths, tile, _chunked(lengths, 2), "packed")
            out[f"{base}_chunked3"] = (lengths, tile, _chunked(lengths, 3), "packed")
            out[f"{base}_chunked3_reversed"] = (lengths, tile, _chunked(lengths, 3)[::-1], "packed")
            out[f"{base}_per_sample"] = (lengths, tile, [[w] for w in whole], "packed")
            out[f"{base}_per_sample_reversed"] = (lengths, tile, [[w] for w in whole[::-1]], "packed")
            out[f"{base}_runs_padded_permuted"] = (lengths, tile, _chunked(lengths, 2), "runs")
            out[f"{base}_rows_whole"] = (lengths, tile, [whole], "rows")
            out[f"{base}_rows_chunked3_scrambled"] = (lengths, tile, _chunked(lengths, 3), "rows")
    # the bench case's shape, small: 13 irregular samples, tile 64, one call and three calls
    from gradsweep.bench.cases import irregular

    lengths = list(irregular(2000, 13))
    out["irregular_packed"] = (lengths, 64, [[(s, 0, n) for s, n in enumerate(lengths)]], "packed")
    out["irregular_chunked3"] = (lengths, 64, _chunked(lengths, 3), "packed")
    return out


def _rows(call: list[Piece], how: str, rng: np.random.Generator) -> RowIdentity:
    if how == "packed":
        return RowIdentity.packed([p[2] for p in call], [p[0] for p in call], [p[1] for p in call])
    row0, r = [], 2  # pad rows before, between and after the runs
    for _, _, n in call:
        row0.append(r)
        r += n + 1
    order = rng.permutation(len(call))
    runs = RowIdentity.from_runs(r + 3, [call[i][0] for i in order], [call[i][1] for i in order],
                                 [row0[i] for i in order], [call[i][2] for i in order])
    if how == "runs":
        return runs
    sample, position = runs.sample.clone(), runs.position.clone()
    perm = torch.from_numpy(rng.permutation(len(sample)))
    return RowIdentity(sample[perm], position[perm])


def _tensors(rows: RowIdentity, call: int) -> tuple[torch.Tensor, ...]:
    """Row r of call k holds k * 100000 + r (exact in float32), so the rows a tile reads name their origin."""
    value = torch.arange(rows.num_rows, dtype=torch.float32) + call * 100000
    return torch.stack([value, -value], 1), (value * 2).to(torch.int64)


def _uploads(into: list[np.ndarray]):
    """Every host array the fold uploads (staging copy indices, descriptors, row tables), in upload order."""
    return seeing_fold_uploads(into.append)


def _record_tiles(rec: dict[str, np.ndarray], prefix: str, fold: CanonicalFold, rows: RowIdentity,
                  tensors: tuple[torch.Tensor, ...]) -> None:
    step = fold.take_tiles(rows, tensors)
    rec[prefix + "host_desc"] = step.host_desc
    rec[prefix + "desc"] = step.desc.cpu().numpy()
    rec[prefix + "ints"] = np.array([step.first_tile, step.tile, step.stage_rows, step.in_place_rows,
                                     step.num_tiles, int(step.staged), int(step.stage is tensors),
                                     len(step.stage), fold.cursor, int(fold.done)], dtype=np.int64)
    read = []
    for row0, count in step.host_desc.tolist():  # the rows each tile reads, in slot order
        src, r = (tensors, row0) if row0 >= 0 else (step.stage, -row0 - 1)
        read.append(src[0][r:r + count, 0].numpy())
        assert torch.equal(src[1][r:r + count], (src[0][r:r + count, 0] * 2).to(torch.int64))
    rec[prefix + "read"] = np.concatenate(read) if read else np.zeros(0, dtype=np.float32)


def _record_table(rec: dict[str, np.ndarray], prefix: str, fold: CanonicalFold, rows: RowIdentity,
                  tensors: tuple[torch.Tensor, ...]) -> None:
    step = fold.take(rows, tensors)
    plan = step.plan.long()
    rec[prefix + "plan"] = step.plan.cpu().numpy()
    values = step.tensors[0][plan.clamp(min=0), 0]
    rec[prefix + "read"] = torch.where(plan >= 0, values, torch.tensor(-1.0)).numpy()
    rec[prefix + "ints"] = np.array([step.first_tile, step.num_tiles, len(step.tensors), step.tensors[0].shape[0],
                                     fold.cursor, int(fold.done)], dtype=np.int64)


def records() -> dict[str, np.ndarray]:
    """Every field of every plan of every layout, cold then replayed, by ``take_tiles`` and by ``take``."""
    rec: dict[str, np.ndarray] = {}
    for name, (lengths, tile, calls, how) in _layouts().items():
        kinds: dict[str, Callable] = {"tiles": _record_tiles, "table": _record_table}
        for kind, record in kinds.items():
            clear_plan_caches()
            for attempt in ("cold", "replay"):
                rng = np.random.default_rng(7)
                fold = CanonicalFold(torch.zeros(2), lengths, tile)
                for k, call in enumerate(calls):
                    rows = _rows(call, how, rng)
                    prefix = f"{name}/{kind}/{attempt}/{k}/"
                    sent: list[np.ndarray] = []
                    with _uploads(sent):
                        record(rec, prefix, fold, rows, _tensors(rows, k))
                    for i, a in enumerate(sent):  # (a replayed call uploads nothing)
                        rec[f"{prefix}upload{i}"] = a
                assert fold.done
    return rec


def _pack(rec: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The records as two arrays (an npz member per field would make the file mostly zip headers): every
    field's bytes one after another, and a JSON index of (key, dtype, shape)."""
    index = [(k, a.dtype.str, list(a.shape)) for k, a in rec.items()]
    blob = b"".join(np.ascontiguousarray(a).tobytes() for a in rec.values())
    return {"index": np.frombuffer(json.dumps(index).encode(), dtype=np.uint8),
            "blob": np.frombuffer(blob, dtype=np.uint8)}


def _unpack(packed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rec, at, blob = {}, 0, packed["blob"].tobytes()
    for key, dtype, shape in json.loads(packed["index"].tobytes()):
        n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        rec[key] = np.frombuffer(blob[at:at + n], dtype=dtype).reshape(shape)
        at += n
    return rec


def _golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as f:
        return _unpack({k: f[k] for k in f.files})


def test_every_plan_field_matches_the_golden_file() -> None:
    golden = _golden()
    now = records()
    assert list(now) == list(golden)
    for key in golden:
        want, got = golden[key], now[key]
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert np.array_equal(got, want), key


@pytest.mark.parametrize("name", ["irregular_packed", "irregular_chunked3"])
def test_golden_layouts_cover_staging_and_direct_tiles(name: str) -> None:
    """The golden set is not vacuous: the chunked bench shape stages rows, the packed one reads all in place."""
    golden = _golden()
    descs = [a for k, a in golden.items() if k.startswith(f"{name}/tiles/cold/") and k.endswith("host_desc")]
    staged = any((d[:, 0] < 0).any() for d in descs)
    assert staged == (name == "irregular_chunked3")


if __name__ == "__main__":  # (re)write the golden file: only with the planning code the file is meant to pin
    GOLDEN.parent.mkdir(exist_ok=True)
    np.savez_compressed(GOLDEN, **_pack(records()))
    print(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)")
