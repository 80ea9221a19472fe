"""The CUDA C++ family's folds read the carried rows in place (``FoldStep.bases``): a ``take`` step's row space is the
fold's staging rows [0, n_stage), then the call's own rows, and the kernels (rms_norm / qk_norm dweight tiles, the dW
fold on both GEMM paths) take the two bases instead of a ``torch.cat`` of both, which copied every row of every
chunked call on the device (csrc/common.cuh, FoldRows).

On the CPU stand-in (tests/fakes/cuda_ext.py): the chunked layouts do carry rows, the verdict stays green, and a
kernel that reads the carried rows from the wrong base is red. On a GPU: every kernel gives the bits of the same plan
over the concatenated rows (the old path), for runs inside either base (the Hopper fold's TMA windows of both maps),
runs across the boundary, short runs at either base's first rows (gathered), permuted and -1 slots; rows no slot
reads are NaN, the call's rows sit inside a larger NaN tensor and the staging has NaN capacity past n_stage, so a read
off either end of either base shows.
"""

from __future__ import annotations

import collections

import pytest
import torch

from gradsweep.cuda_kernels import runtime
from gradsweep.harness.compare import bitwise_compare
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.results import Status
from tests.cuda_gpu import needs_cuda_kernels
from tests.fakes import cuda_ext

FOLDS = {"det_gemm": "gemm_dw_fold", "rms_norm": "rms_norm_dw_tiles", "qk_norm": "qk_norm_dw_tiles"}


@pytest.fixture
def fake_ext(monkeypatch: pytest.MonkeyPatch):
    ext = cuda_ext.install(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield ext
    torch.set_num_threads(threads)


@pytest.mark.parametrize("op", sorted(FOLDS))
def test_chunked_calls_fold_carried_rows_in_place(fake_ext, monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """The chunked layout's calls pass carried rows (n_stage > 0) beside the call's own tensors, whose rows are the
    call's alone (no concatenation), and every layout stays green."""
    name = FOLDS[op]
    real = getattr(fake_ext, name)
    seen: collections.Counter = collections.Counter()

    def spy(*args, **kw):
        n_stage = kw.get("n_stage", 0)
        seen[n_stage > 0] += 1
        if n_stage:
            call_x = cuda_ext._t(args[4])  # x: the call's own rows, never the carried ones in front of them
            staged_x = cuda_ext._t(kw["stage_x"])
            assert staged_x.shape[0] == n_stage and call_x.data_ptr() != staged_x.data_ptr()
        return real(*args, **kw)

    monkeypatch.setattr(fake_ext, name, spy)
    report = check_kernel(op, f"cuda.{op}", layouts=["bn_full", "bn_chunked", "bn_permuted", "b1_singleton"])
    assert report.ok, report.first_failure
    assert seen[True] > 0 and seen[False] > 0, seen


@pytest.mark.parametrize("op", sorted(FOLDS))
def test_a_fold_that_drops_the_carried_rows_is_red(fake_ext, monkeypatch: pytest.MonkeyPatch, op: str) -> None:
    """Planted: the kernel reads zeros where the carried rows are (a second base ignored, the rows counted but never
    loaded): the chunked layout's parameter gradient loses what earlier calls left, and the verdict says so."""
    name = FOLDS[op]
    real = getattr(fake_ext, name)

    def dropped(*args, **kw):
        if kw.get("n_stage", 0):
            for key in ("stage_dy", "stage_x", "stage_rstd"):
                if key in kw:
                    kw[key] = cuda_ext._ptr(torch.zeros_like(cuda_ext._t(kw[key])))
        return real(*args, **kw)

    monkeypatch.setattr(fake_ext, name, dropped)
    report = check_kernel(op, f"cuda.{op}", layouts=["bn_full", "bn_chunked"])
    cell = report.cells["bn_chunked"]
    assert report.cells["bn_full"].status == Status.GREEN
    assert cell.status == Status.RED_VERDICT, (cell.status, cell.first_failure)


def test_the_bindings_refuse_carried_rows_without_their_bases() -> None:
    """Checked before any device is touched (so on a CPU box with the built extension too): n_stage > 0 needs a base
    for every row tensor, and the GEMM fold's carried leading dimensions must hold a row."""
    try:
        ext = runtime.load()
    except ImportError:
        pytest.skip("gradsweep._C is not built here")
    with pytest.raises(ValueError, match=r"n_stage > 0 needs every stage_\* base"):
        ext.rms_norm_dw_tiles(0, 1, 64, 0, 0, 0, 0, 8, 0, 0, stage_dy=1, stage_x=1, n_stage=5)
    with pytest.raises(ValueError, match=r"n_stage > 0 needs every stage_\* base"):
        ext.qk_norm_dw_tiles(0, 1, 64, 0, 0, 0, 0, 2, 8, 0, 0, stage_x=1, stage_rstd=1, n_stage=5)
    with pytest.raises(ValueError, match="n_stage must be in"):
        ext.gemm_dw_fold(0, 1, 64, 0, 0, 0, 10, 16, 16, 16, 16, 16, 0, 0, 0, stage_dy=1, stage_x=1, n_stage=-1)
    with pytest.raises(ValueError, match=r"leading dimensions\) too small"):
        ext.gemm_dw_fold(0, 1, 64, 0, 0, 0, 10, 16, 16, 16, 16, 16, 0, 0, 0, stage_dy=1, stage_x=1, n_stage=5,
                         stage_ldy=8, stage_ldx=16)


# --- kernel level: the two bases against the concatenated rows, bit for bit -----------------------------------
# (the GPU tests below run these on the device; tests/test_cuda_emulated.py runs them on the CPU emulation of the
# same kernel sources, the mma.sync path and the norms)

def _bases(gen: torch.Generator, n_stage: int, rows: int, cols: int, device: str):
    """(carried [n_stage, cols] inside a NaN staging of 32 more rows, call [rows, cols] inside a NaN tensor with 8
    rows either side): random bf16 rows on ``device``."""
    staging = torch.full((n_stage + 32, cols), float("nan"), dtype=torch.bfloat16)
    staging[:n_stage] = torch.randn(n_stage, cols, generator=gen).to(torch.bfloat16)
    outer = torch.full((rows + 16, cols), float("nan"), dtype=torch.bfloat16)
    outer[8:8 + rows] = torch.randn(rows, cols, generator=gen).to(torch.bfloat16)
    staging, outer = staging.to(device), outer.to(device)
    return staging[:n_stage], outer[8:8 + rows]


def _unread_nan(carried: torch.Tensor, call: torch.Tensor, plan: torch.Tensor) -> None:
    read = plan[plan >= 0].long()
    n = carried.shape[0]
    mask = torch.ones(n + call.shape[0], dtype=torch.bool, device=plan.device)
    mask[read] = False
    carried[mask[:n]] = float("nan")
    call[mask[n:]] = float("nan")


S, R = 200, 300  # carried rows, the call's rows (row space 0 .. 499)


def _gemm_plan(gen: torch.Generator, device: str) -> torch.Tensor:
    """Tiles of 64 slots over the row space: runs in the carried rows (TMA windows of the carried map; one short
    run at its row 0, gathered; one ending at its last row), runs in the call's (at its row 0, short at row 3
    (gathered), short at row 100, ending at its last row), runs across the boundary (a tile that starts carried
    and ends in the call: the canonical split tile), a permuted tile with -1 slots, an all -1 tile."""
    runs = ((70, 64), (0, 5), (150, 40), (136, 64), (180, 64), (S, 64), (S + 3, 10), (S + 100, 30),
            (S + R - 64, 64), (170, 64), (S + R - 1, 1), (0, 0))
    plan = torch.full((len(runs) + 1, 64), -1, dtype=torch.int32)
    for t, (first, count) in enumerate(runs):
        plan[t, :count] = torch.arange(first, first + count, dtype=torch.int32)
    perm = torch.randperm(S + R, generator=gen)[:64].to(torch.int32)
    perm[torch.rand(64, generator=gen) < 0.2] = -1
    plan[len(runs)] = perm
    return plan.to(device)


def _dw_fold(ext, dev: int, stream: int, path: int, plan: torch.Tensor, g: torch.Tensor, shape: tuple[int, int],
             ops: tuple[torch.Tensor, ...], carried: bool) -> None:
    """gemm_dw_fold of ``plan`` into g [n, k] by ``path``: over the two bases (carried) or the concatenated rows."""
    (n, k), (dy_st, x_st, dy, x, dy_cat, x_cat) = shape, ops
    p = plan.contiguous()
    if carried:
        ext.gemm_dw_fold(p.data_ptr(), p.shape[0], 64, dy.data_ptr(), x.data_ptr(), g.data_ptr(), x.shape[0], n, k,
                         dy.stride(0), x.stride(0), k, dev, stream, path, stage_dy=dy_st.data_ptr(),
                         stage_x=x_st.data_ptr(), n_stage=x_st.shape[0], stage_ldy=dy_st.stride(0),
                         stage_ldx=x_st.stride(0))
    else:
        ext.gemm_dw_fold(p.data_ptr(), p.shape[0], 64, dy_cat.data_ptr(), x_cat.data_ptr(), g.data_ptr(),
                         x_cat.shape[0], n, k, dy_cat.stride(0), x_cat.stride(0), k, dev, stream, path)


def dw_fold_differences(ext, dev: int, stream: int, paths: list[int], device: str,
                        shapes: tuple[tuple[int, int], ...] = ((256, 512), (1000, 1032), (136, 264))) -> list[str]:
    """gemm_dw_fold with the carried rows as a second base against the concatenated rows, by each path in ``paths``
    (1 mma.sync, 2 wgmma), whole and split across two launches; the paths against each other. What differs."""
    gen = torch.Generator().manual_seed(31)
    bad = []
    for n, k in shapes:
        dy_st, dy = _bases(gen, S, R, n, device)
        x_st, x = _bases(gen, S, R, k, device)
        plan = _gemm_plan(gen, device)
        _unread_nan(dy_st, dy, plan)
        _unread_nan(x_st, x, plan)
        dy_cat, x_cat = torch.cat([dy_st, dy]), torch.cat([x_st, x])
        g0 = torch.randn(n, k, generator=gen)
        g0[torch.rand(n, k, generator=gen) < 0.05] = -0.0
        g0 = g0.to(device)
        outs, ops = {}, (dy_st, x_st, dy, x, dy_cat, x_cat)
        for path in paths:
            want, got, split = g0.clone(), g0.clone(), g0.clone()
            _dw_fold(ext, dev, stream, path, plan, want, (n, k), ops, carried=False)
            _dw_fold(ext, dev, stream, path, plan, got, (n, k), ops, carried=True)
            _dw_fold(ext, dev, stream, path, plan[:5], split, (n, k), ops, carried=True)
            _dw_fold(ext, dev, stream, path, plan[5:], split, (n, k), ops, carried=True)
            if device != "cpu":
                torch.cuda.synchronize()
            for label, other in (("in place", got), ("in place, split", split)):
                diff = bitwise_compare(want, other)
                if not diff.equal:
                    bad.append(f"path {path} N={n} K={k}: {label} differs from concatenated in {diff.mismatched}")
            if torch.isnan(got).any():
                bad.append(f"path {path} N={n} K={k}: NaN read (a row no slot names)")
            outs[path] = got
        if len(outs) == 2 and not bitwise_compare(outs[1], outs[2]).equal:
            bad.append(f"N={n} K={k}: the two paths differ with carried rows in place")
    return bad


def _row_plan(gen: torch.Generator, tiles: int, device: str) -> torch.Tensor:
    """[tiles, 64]: each tile a run or a permutation of the row space with -1 slots (rows of both bases)."""
    plan = torch.full((tiles, 64), -1, dtype=torch.int32)
    for t in range(tiles):
        if t % 2:
            first = int(torch.randint(0, S + R - 64, (1,), generator=gen))
            plan[t] = torch.arange(first, first + 64, dtype=torch.int32)
        else:
            plan[t] = torch.randperm(S + R, generator=gen)[:64].to(torch.int32)
        plan[t, torch.rand(64, generator=gen) < 0.15] = -1
    return plan.to(device)


def norm_tiles_differences(ext, dev: int, stream: int, hidden: int, device: str) -> list[str]:
    """rms_norm_dw_tiles ([rows, hidden]) and qk_norm_dw_tiles (4 heads of hidden / 4) with the carried rows as second
    bases against the concatenated rows' partials. What differs."""
    gen = torch.Generator().manual_seed(hidden)
    plan = _row_plan(gen, 9, device)
    bad = []
    heads = 4
    for op, width in (("rms_norm", hidden), ("qk_norm", hidden // heads)):
        cols = width * heads if op == "qk_norm" else width
        dy_st, dy = _bases(gen, S, R, cols, device)
        x_st, x = _bases(gen, S, R, cols, device)
        r_cols = heads if op == "qk_norm" else 1
        r_st = (torch.rand(S, r_cols, generator=gen) + 0.5).to(device)
        r = (torch.rand(R, r_cols, generator=gen) + 0.5).to(device)
        _unread_nan(dy_st, dy, plan)
        _unread_nan(x_st, x, plan)
        cat = [torch.cat(p) for p in ((dy_st, dy), (x_st, x), (r_st, r))]
        out = {}
        for carried in (False, True):
            part = torch.full((plan.shape[0], width), float("nan"), device=device)
            bases = (dy, x, r) if carried else cat
            extra = {"stage_dy": dy_st.data_ptr(), "stage_x": x_st.data_ptr(), "stage_rstd": r_st.data_ptr(),
                     "n_stage": S} if carried else {}
            ptrs = [t.data_ptr() for t in bases]
            if op == "rms_norm":
                ext.rms_norm_dw_tiles(plan.data_ptr(), plan.shape[0], 64, *ptrs, part.data_ptr(), width, dev, stream,
                                      **extra)
            else:
                ext.qk_norm_dw_tiles(plan.data_ptr(), plan.shape[0], 64, *ptrs, part.data_ptr(), heads, width, dev,
                                     stream, **extra)
            out[carried] = part
        if device != "cpu":
            torch.cuda.synchronize()
        diff = bitwise_compare(out[False], out[True])
        if not diff.equal:
            bad.append(f"{op} width {width}: {diff.mismatched} partials differ")
        if torch.isnan(out[True]).any():
            bad.append(f"{op} width {width}: NaN in the partials (a row no slot names was read)")
    return bad


def _ext():
    ext = runtime.load()
    return ext, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_dw_fold_carried_in_place_equals_concatenated() -> None:
    """gemm_dw_fold with the carried rows as a second base gives the concatenated rows' bits, on the mma.sync path
    and (on a CC 9.0 device with the Hopper build) the wgmma path, whole and split across two launches; both paths
    agree."""
    ext, dev, stream = _ext()
    paths = [1]
    if torch.cuda.get_device_capability() == (9, 0) and ext.build_info().get("sm90_gemm"):
        paths.append(2)
    bad = dw_fold_differences(ext, dev, stream, paths, "cuda")
    assert not bad, bad


@pytest.mark.gpu
@needs_cuda_kernels
@pytest.mark.parametrize("hidden", [4096, 200, 100])
def test_gpu_norm_dweight_tiles_carried_in_place_equal_concatenated(hidden: int) -> None:
    """rms_norm_dw_tiles (hidden 4096 / 200: the 16-byte path; 100: not a multiple of 8) and qk_norm_dw_tiles
    (heads 4 x head_dim hidden / 4) with the carried rows as second bases give the concatenated rows' partials."""
    ext, dev, stream = _ext()
    bad = norm_tiles_differences(ext, dev, stream, hidden, "cuda")
    assert not bad, bad
