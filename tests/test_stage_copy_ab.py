"""scripts/stage_copy_ab.py (the piece-driven staging copy's A/B, run on the GPU): both sides must stage the same
rows, or the A/B times two different copies. Checked under the interpreter on host tensors: the pieces it draws are
disjoint and inside the source and cover every staging row once, and the piece kernel copies exactly what
``index_select`` + ``index_copy_`` over the fold's own row index copy, to the bit."""

from __future__ import annotations

import numpy as np
import torch

from scripts.stage_copy_ab import by_pieces, index_of, pieces_of, today


def test_pieces_are_disjoint_and_inside_the_source() -> None:
    pieces = pieces_of(np.random.default_rng(3), 512, 200, 7)
    length = pieces[:, 2]
    assert length.sum() == 200 and (length > 0).all()
    rows = index_of(pieces)
    assert len(set(rows[0].tolist())) == 200 and rows[0].min() >= 0 and rows[0].max() < 512
    assert sorted(rows[1].tolist()) == list(range(200))


def test_the_piece_copy_stages_what_the_index_ops_stage() -> None:
    pieces = pieces_of(np.random.default_rng(5), 300, 120, 6)
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(300, w, generator=gen).to(torch.bfloat16) for w in (96, 40)]
    a = [torch.zeros(120, t.shape[1], dtype=torch.bfloat16) for t in tensors]
    b = [torch.full_like(s, 7.0) for s in a]
    cpu = torch.device("cpu")
    today(pieces, tensors, a, cpu)
    by_pieces(pieces, tensors, b, cpu)
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))
    assert (a[0] != 0).all()
