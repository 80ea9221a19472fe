"""``upload_parts`` (gradsweep/uploads.py): several host arrays through one pinned copy, handed back as views with
the arrays' own dtypes, shapes and values (the fold's staged calls upload their row index and descriptors so)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradsweep import uploads

PARTS = [np.arange(74, dtype=np.int64).reshape(2, 37) * -3, np.arange(10, dtype=np.int32).reshape(5, 2) - 4,
         np.empty((0, 2), dtype=np.int32), np.array([1.5, -0.0, 3.25], dtype=np.float32),
         np.arange(3, dtype=np.int32)]


def _same(views: list[torch.Tensor], parts: list[np.ndarray]) -> None:
    assert len(views) == len(parts)
    for v, a in zip(views, parts):
        assert tuple(v.shape) == a.shape and v.numpy().dtype == a.dtype
        assert v.is_contiguous()
        assert np.array_equal(v.numpy().view(np.uint8), a.view(np.uint8))  # bits, -0.0 included


def test_packed_parts_come_back_bit_for_bit_and_aligned() -> None:
    host, offsets = uploads.pack_parts(PARTS)
    assert all(off % 16 == 0 for off in offsets) and host.dtype == np.uint8
    assert offsets == sorted(offsets) and host.nbytes >= offsets[-1] + PARTS[-1].nbytes
    _same(uploads.part_views(torch.from_numpy(host), PARTS, offsets), PARTS)


def test_a_gpu_upload_of_parts_is_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CUDA device the parts travel in one ``upload`` (stood in for here: no GPU), their views share it."""
    calls: list[np.ndarray] = []

    def fake_upload(a, device, dtype=None):
        calls.append(np.array(a))
        return torch.from_numpy(np.array(a))

    monkeypatch.setattr(uploads, "upload", fake_upload)
    views = uploads.upload_parts(PARTS, torch.device("cuda"))
    assert len(calls) == 1 and calls[0].dtype == np.uint8
    _same(views, PARTS)
    base = views[0].untyped_storage().data_ptr()
    assert all(v.untyped_storage().data_ptr() == base for v in views)


def test_a_cpu_upload_of_parts_is_each_part() -> None:
    _same(uploads.upload_parts(PARTS, torch.device("cpu")), PARTS)
