"""``CanonicalFold.take(..., stage_copy=...)`` (the CUDA C++ family's fold path) stages exactly what the row-index
copy stages, and the family's ``copy_pieces`` kernel copies exactly what ``index_select`` + ``index_copy_`` copy.

On the CPU the fold side runs with a piece copy written in torch (the kernel needs a GPU): with either planner,
planned and replayed, on random steps, the row table, every staged row each table entry reads and the fold's
state after each call equal the index path's, and the carried rows go up in one upload with the table. On a GPU
the kernel itself is compared with the index ops to the bit (every dtype a fold stages, strided sources), and the
CUDA rms_norm dweight and GEMM dW main grads of a chunked step keep their bits with either copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradsweep import canonical
from gradsweep.canonical import CanonicalFold
from tests import test_canonical_plan_speed_equivalence as digests
from tests.cuda_gpu import needs_cuda_kernels
from tests.test_fold_plan_native import _state
from tests.test_stage_copy_pieces import PLANNERS, _chunked_rows, _dw_main_grad, use_planner


def _torch_piece_copy(pieces: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, longest: int) -> None:
    """The piece copy's meaning, in torch: each piece's rows of src to its staging rows."""
    assert int(pieces[:, 2].max()) == longest
    for s0, d0, n in pieces.tolist():
        dst[d0:d0 + n].copy_(src[s0:s0 + n])


def _table_reads(step) -> list:
    rows = step.plan.reshape(-1).tolist()
    return [[t[r].tolist() if r >= 0 else None for r in rows] for t in step.tensors]


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("replay", [False, True], ids=["planned", "replayed"])
def test_take_with_pieces_stages_what_the_index_stages(planner, replay, monkeypatch):
    use_planner(planner, replay, monkeypatch)
    rng = np.random.default_rng(17)
    pieces_calls = 0
    for trial in range(20):
        lengths, tile = digests._lengths(rng), int(rng.choice(digests.TILES))
        calls = digests._pieces(rng, lengths)
        make = [digests._as_packed, lambda c: digests._as_runs(rng, c), lambda c: digests._as_rows(rng, c)]
        shapes = [int(rng.integers(0, 3)) for _ in calls]
        for _ in range(2 if replay else 1):
            folds = [CanonicalFold(torch.zeros(2), lengths, tile) for _ in range(2)]
            for k, (call, how) in enumerate(zip(calls, shapes)):
                rows = make[how](call)
                tensors = digests._tensors(rows, 1000 * trial + k)
                seen: list[int] = []

                def spy(pieces, src, dst, longest, seen=seen):
                    seen.append(pieces.shape[0])
                    _torch_piece_copy(pieces, src, dst, longest)

                a = folds[0].take(rows, tensors)
                b = folds[1].take(rows, tensors, stage_copy=spy)
                assert a.first_tile == b.first_tile and torch.equal(a.plan, b.plan), (trial, k)
                assert _table_reads(a) == _table_reads(b), (trial, k)
                assert _state(folds[0]) == _state(folds[1]), (trial, k)
                pieces_calls += bool(seen) and max(seen) > 1
    assert pieces_calls > 0  # the piece path ran, with several pieces a call


def test_pieces_and_the_table_go_up_in_one_upload(monkeypatch):
    """The index path uploads the row index, then the table (two pinned copies); the piece path one."""
    canonical.clear_plan_caches()
    monkeypatch.setattr(canonical, "TRANSITION_SLOTS", 0)
    lengths = [70, 3, 129, 64, 1, 90]
    counts = {}
    for name, copy in (("index", None), ("pieces", _torch_piece_copy)):
        n = {"upload": 0, "parts": 0}
        real_upload, real_parts = canonical.upload, canonical.upload_parts

        def upload(a, device, n=n, real=real_upload):
            n["upload"] += 1
            return real(a, device)

        def upload_parts(arrays, device, n=n, real=real_parts):
            n["parts"] += 1
            return real(arrays, device)

        monkeypatch.setattr(canonical, "upload", upload)
        monkeypatch.setattr(canonical, "upload_parts", upload_parts)
        fold = CanonicalFold(torch.zeros(8), lengths, 32)
        gen = torch.Generator().manual_seed(0)
        for rows in _chunked_rows(lengths, 3):
            fold.take(rows, (torch.randn(rows.num_rows, 8, generator=gen),), stage_copy=copy)
        counts[name] = n
    assert counts["pieces"]["parts"] > 0
    assert counts["pieces"]["upload"] + counts["pieces"]["parts"] < counts["index"]["upload"] + counts["index"]["parts"]


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.int64, torch.bool])
@pytest.mark.parametrize("width", [1, 3, 48, 4096])
@pytest.mark.parametrize("strided", [False, True])
def test_the_kernel_copies_what_the_index_ops_copy(dtype, width, strided):
    from gradsweep.cuda_kernels.stage_copy import copy_pieces

    gen = torch.Generator(device="cuda").manual_seed(width)
    rows = 700
    full = torch.randint(-1000, 1000, (rows, width + 5 * strided), generator=gen, device="cuda").to(dtype)
    src = full[:, :width] if strided else full
    src = src.squeeze(1) if width == 1 and not strided else src  # a tensor of one value a row (ids, rstd)
    pieces_np = np.array([[0, 40, 17], [100, 0, 40], [300, 57, 200], [699, 257, 1]], dtype=np.int32)
    index = canonical._piece_rows(*pieces_np.T.astype(np.int64))
    a = torch.full((258, *src.shape[1:]), 7, dtype=dtype, device="cuda")
    b = a.clone()
    i = torch.from_numpy(index).cuda()
    a.index_copy_(0, i[1], src.index_select(0, i[0]))
    copy_pieces(torch.from_numpy(pieces_np).cuda(), src, b, 200)
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("which", ["rms_norm", "det_gemm"])
def test_cuda_main_grads_are_the_same_bits_with_either_copy(which, monkeypatch):
    from gradsweep.cuda_kernels import gemm as cuda_gemm
    from gradsweep.cuda_kernels import rms_norm as cuda_rms
    from gradsweep.cuda_kernels import stage_copy

    lengths = [70, 3, 129, 64, 1, 90]
    gen = torch.Generator(device="cuda")

    def rms() -> torch.Tensor:
        gen.manual_seed(11)
        hidden = 96
        weight = torch.randn(hidden, generator=gen, device="cuda").to(torch.bfloat16)
        fold = CanonicalFold(torch.randn(hidden, generator=gen, device="cuda"), lengths, cuda_rms.TILE)
        for rows in _chunked_rows(lengths, 3):
            x = torch.randn(rows.num_rows, hidden, generator=gen, device="cuda").to(torch.bfloat16)
            dy = torch.randn(rows.num_rows, hidden, generator=gen, device="cuda").to(torch.bfloat16)
            _, rstd = cuda_rms.rms_norm_forward(x, weight, 1e-6)
            cuda_rms.rms_norm_fold_dweight(dy, x, rstd, rows, fold)
        return fold.main_grad.clone()

    run, site = (rms, cuda_rms) if which == "rms_norm" else \
        (lambda: _dw_main_grad(lengths, 3, 64, 96, cuda_gemm, "cuda"), cuda_gemm)
    seen: list[int] = []

    def spy(pieces, src, dst, longest):
        seen.append(pieces.shape[0])
        stage_copy.copy_pieces(pieces, src, dst, longest)

    monkeypatch.setattr(site, "copy_pieces", spy)
    canonical.clear_plan_caches()
    with_pieces = run()
    assert max(seen, default=0) > 1
    monkeypatch.setattr(site, "copy_pieces", None)
    canonical.clear_plan_caches()
    with_index = run()
    assert torch.equal(with_pieces.view(torch.int32), with_index.view(torch.int32))
