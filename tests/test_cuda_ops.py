"""The CUDA family's ops (gradsweep.cuda_kernels) through the one kernel check, ``check_kernel``.

- CPU: every op's Python glue (fold plans, carried rows, chunk loops, argument order, strides) runs through
  ``check_kernel(op, "cuda.<op>")`` against a CPU stand-in of gradsweep._C (tests/fakes/cuda_ext.py), on every
  layout of the default manifest, judged exactly as a sweep cell (accuracy from manifests/contract.yaml,
  invariance bitwise); planted faults in the stand-in (a fold that ignores the loaded main grad, tiles folded
  in reverse, a logp that sees its neighbours) go red; bad input fails with one-line ValueErrors.
- GPU (``-m gpu``): ``check_kernel(op, "cuda.<op>", device="cuda")`` on the real kernels, and rows computed
  alone vs in batches of other sizes, compared bitwise.
"""

from __future__ import annotations

import threading

import pytest
import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.contract import CheckKind, load_contract
from gradsweep.cuda_kernels import runtime
from gradsweep.harness.compare import bitwise_compare, normwise_error
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.manifest import MANIFEST_DIR
from gradsweep.results import Status
from tests.cuda_gpu import needs_cuda_kernels
from tests.fakes import cuda_ext

LAUNCHERS = ("qk_norm_dw_tiles", "embedding_fwd", "embedding_fold", "pack_rows", "logp_fwd", "logp_bwd",
             "gemm_nt", "gemm_nn", "gemm_dw_fold", "llp_forward", "llp_dlogits")
# The ops the CPU stand-in implements (issue 10, and rms_norm's fold glue); the GPU also runs the other row-wise
# ops of issue 7.
STAND_IN_OPS = ("det_gemm", "lm_head", "linear_logp", "logp", "batch_invariant_logp", "embedding", "qk_norm", "pack",
                "rms_norm")
GPU_OPS = (*STAND_IN_OPS, "rope", "silu", "swiglu")


@pytest.fixture
def fake_ext(monkeypatch: pytest.MonkeyPatch):
    ext = cuda_ext.install(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one reduction order for the stand-in's float64 sums
    yield ext
    torch.set_num_threads(threads)


@pytest.mark.parametrize("op", STAND_IN_OPS)
def test_glue_on_cpu_stand_in(fake_ext, op: str) -> None:
    report = check_kernel(op, f"cuda.{op}")
    assert report.cells and report.ok, report.first_failure


def test_a_fold_that_ignores_the_loaded_main_grad_is_red(fake_ext, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fake_ext.gemm_dw_fold

    def no_load(plan, n_tiles, tile, dy, x, grad, rows, N, K, ldy, ldx, ldg, device, stream, **carried):
        cuda_ext._rows(grad, N, K, ldg).zero_()
        real(plan, n_tiles, tile, dy, x, grad, rows, N, K, ldy, ldx, ldg, device, stream, **carried)

    monkeypatch.setattr(fake_ext, "gemm_dw_fold", no_load)
    report = check_kernel("det_gemm", "cuda.det_gemm", layouts=["bn_full"])
    assert report.status == Status.RED_VERDICT and "dW" in report.first_failure


def test_tiles_folded_in_reverse_are_red(fake_ext, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fake_ext.gemm_dw_fold

    def reversed_tiles(plan, n_tiles, tile, dy, x, grad, rows, N, K, ldy, ldx, ldg, device, stream, **carried):
        p = cuda_ext._t(plan).reshape(-1)[: n_tiles * tile].view(n_tiles, tile).flip(0).contiguous()
        real(cuda_ext._ptr(p), n_tiles, tile, dy, x, grad, rows, N, K, ldy, ldx, ldg, device, stream, **carried)

    monkeypatch.setattr(fake_ext, "gemm_dw_fold", reversed_tiles)
    report = check_kernel("det_gemm", "cuda.det_gemm", layouts=["bn_full", "bn_chunked"])
    assert report.cells["bn_chunked"].status == Status.RED_VERDICT
    assert "dW" in (report.cells["bn_chunked"].first_failure or "")


def test_a_logp_that_sees_its_neighbours_is_red(fake_ext, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fake_ext.logp_fwd

    def batch_max(logits, targets, out, lse, rows, vocab, ld, device, stream):
        real(logits, targets, out, lse, rows, vocab, ld, device, stream)
        z = cuda_ext._rows(logits, rows, vocab, ld).float()
        cuda_ext._t(out)[:rows] += torch.nan_to_num(z, nan=0.0, posinf=0.0, neginf=0.0).amax() * 1e-3

    monkeypatch.setattr(fake_ext, "logp_fwd", batch_max)
    report = check_kernel("logp", "cuda.logp", layouts=["bn_full", "b1_singleton"])
    assert report.cells["b1_singleton"].status == Status.RED_VERDICT


def test_launchers_are_built() -> None:
    try:
        ext = runtime.load()
    except ImportError:
        pytest.skip("gradsweep._C is not built here")
    missing = [n for n in LAUNCHERS if not hasattr(ext, n)]
    assert not missing, f"gradsweep._C lacks {missing}: rebuild (python setup.py build_ext --inplace)"
    assert int(ext.LLP_VCHUNK) % 128 == 0


def test_ops_reject_cpu_tensors_and_bad_shapes() -> None:
    from gradsweep.cuda_kernels import (
        batch_invariant_logp,
        embedding,
        gemm,
        linear_logp,
        lm_head,
        logp,
        pack,
        qk_norm,
    )

    x = torch.zeros(3, 8, dtype=torch.bfloat16)
    w = torch.zeros(5, 8, dtype=torch.bfloat16)
    t = torch.zeros(3, dtype=torch.int64)
    rows = RowIdentity.packed([3])
    for call in (lambda: gemm.det_linear(x, w, rows, None), lambda: lm_head.lm_head(x, w, rows, None),
                 lambda: linear_logp.linear_logp(x, w, t, rows, None), lambda: logp.selected_logp(x, t),
                 lambda: batch_invariant_logp.batch_invariant_logp(x, w, t, rows, None),
                 lambda: embedding.embedding(t, w, rows, None),
                 lambda: qk_norm.qk_norm(x.view(3, 1, 8), torch.ones(8, dtype=torch.bfloat16), 1e-6, rows, None),
                 lambda: pack.pack(x.view(1, 3, 8), torch.tensor([3]))):
        with pytest.raises(ValueError, match="CUDA tensor"):
            call()
    with pytest.raises(ValueError, match="do not match"):
        gemm.det_linear(x, torch.zeros(5, 7, dtype=torch.bfloat16), rows, None)
    with pytest.raises(ValueError, match="head_dim"):
        qk_norm.qk_norm(x.view(3, 1, 8), torch.ones(7, dtype=torch.bfloat16), 1e-6, rows, None)


def test_fold_required_on_cpu_stand_in(fake_ext) -> None:
    from gradsweep.cuda_kernels import embedding, gemm, linear_logp

    x = torch.ones(3, 16, dtype=torch.bfloat16)
    w = torch.ones(32, 16, dtype=torch.bfloat16, requires_grad=True)
    rows = RowIdentity.packed([3])
    with pytest.raises(ValueError, match="fold"):
        gemm.det_linear(x, w, rows, None)
    with pytest.raises(ValueError, match="fold"):
        linear_logp.linear_logp(x, w, torch.zeros(3, dtype=torch.int64), rows, None)
    with pytest.raises(ValueError, match="fold"):
        embedding.embedding(torch.zeros(3, dtype=torch.int64), w, rows, None)
    fold = CanonicalFold(torch.zeros(32, 16), [3], 40)  # 40 is not a multiple of 16
    y = gemm.det_linear(x, w, rows, fold)
    with pytest.raises(ValueError, match="multiple of 16"):
        y.backward(torch.ones_like(y))


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.parametrize("op", GPU_OPS)
@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_check(op: str) -> None:
    report = check_kernel(op, f"cuda.{op}", device="cuda")
    assert report.cells and report.ok, report.first_failure


def _rows_alone_vs_batched(fn, inputs: list[torch.Tensor], sizes=(1, 7, 64, 1000)) -> list[str]:
    """Rows of ``fn(*inputs)`` for the full batch vs the first m rows computed alone, bitwise; the differences."""
    full = fn(*inputs)
    bad = []
    for m in sizes:
        part = fn(*[t[:m] for t in inputs])
        diff = bitwise_compare(full[:m], part)
        if not diff.equal:
            bad.append(f"M={m}: {diff.mismatched} elements differ")
    return bad


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_rows_do_not_depend_on_the_batch() -> None:
    """M-independence at realistic widths: a row's bits are the same whatever rows share its call."""
    from gradsweep.cuda_kernels import gemm, linear_logp, logp, rms_norm

    gen = torch.Generator().manual_seed(3)
    dev = "cuda"

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16).to(dev)

    x, w = randn(1000, 4096), randn(4096, 4096, scale=4096 ** -0.5)
    t = torch.randint(0, 32000, (1000,), generator=gen).to(dev)
    lm = randn(32000, 4096, scale=4096 ** -0.5)
    rows = lambda n: RowIdentity.packed([n])  # noqa: E731
    bad = {
        "det_linear": _rows_alone_vs_batched(lambda a: gemm.matmul_invariant(a, w), [x]),
        "rms_norm": _rows_alone_vs_batched(lambda a: rms_norm.rms_norm_forward(a, w[0], 1e-6)[0], [x]),
        "logp": _rows_alone_vs_batched(lambda z, tt: logp.selected_logp(z, tt), [randn(1000, 32000), t]),
        "linear_logp": _rows_alone_vs_batched(
            lambda h, tt: linear_logp.linear_logp(h, lm, tt, rows(h.shape[0]), None), [x, t]),
    }
    assert not any(bad.values()), bad


def rms_row_path_differences(ext, device: str, index: int, stream: int, hiddens, row_counts,
                             modes=(1, -1)) -> list[str]:
    """rms_norm's one-warp-per-row path (``warp_rows`` 1, or -1: the launcher's choice) against its one-block-per-row
    path (0), bit for bit: y, rstd and dx at each width and row count, aligned and one element into the storage (the
    element loads), with a zero row (rstd = rsqrt(eps)) and signed zeros; the differences. ``ext``: gradsweep._C
    or the CPU emulation (tests/test_cuda_emulated.py)."""
    gen = torch.Generator().manual_seed(11)
    bad = []
    for hidden in hiddens:
        for rows in row_counts:
            for offset in (0, 1):
                x, dy = ((torch.randn(rows * hidden + offset, generator=gen).to(torch.bfloat16).to(device)[offset:])
                         .view(rows, hidden) for _ in range(2))
                x[0, 0], dy[min(1, rows - 1), -1] = 0.0, -0.0
                if rows > 2:
                    x[2].zero_()
                w = (torch.randn(hidden, generator=gen) * 0.5).to(torch.bfloat16).to(device)
                out = {}
                for mode in (0, *modes):
                    y, rstd, dx = torch.empty_like(x), torch.empty(rows, device=device), torch.empty_like(x)
                    ext.rms_norm_fwd(x.data_ptr(), w.data_ptr(), y.data_ptr(), rstd.data_ptr(), rows, hidden, 1e-6,
                                     index, stream, warp_rows=mode)
                    ext.rms_norm_bwd_dx(dy.data_ptr(), x.data_ptr(), w.data_ptr(), rstd.data_ptr(), dx.data_ptr(),
                                        rows, hidden, index, stream, warp_rows=mode)
                    out[mode] = (y, rstd, dx)
                for mode in modes:
                    for name, a, b in zip(("y", "rstd", "dx"), out[0], out[mode]):
                        diff = bitwise_compare(a, b)
                        if not diff.equal:
                            bad.append(f"H={hidden} R={rows} offset={offset} warp_rows={mode} {name}: "
                                       f"{diff.mismatched} differ")
    return bad


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_rms_norm_warp_rows_equal_the_block_rows() -> None:
    """rms_norm's one-warp-per-row kernels (hidden <= 256: QK-norm's heads) give the bits of the one-block-per-row
    kernels, forward (y, rstd) and dx, aligned and unaligned, with special values; and a row alone equals it in a
    batch on the warp path (rows share a warp there)."""
    from gradsweep.cuda_kernels import rms_norm

    bad = rms_row_path_differences(runtime.load(), "cuda", torch.cuda.current_device(),
                                   torch.cuda.current_stream().cuda_stream, (1, 8, 64, 100, 128, 200, 256),
                                   (1, 5, 33, 1001))
    assert not bad, bad[:10]
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(1000, 128, generator=gen).to(torch.bfloat16).cuda()
    w = torch.randn(128, generator=gen).to(torch.bfloat16).cuda()
    lone = _rows_alone_vs_batched(lambda a: rms_norm.rms_norm_forward(a, w, 1e-6)[0], [x], sizes=(1, 3, 31, 33))
    assert not lone, lone


def _hopper_ext_or_skip(what: str):
    """The extension, device and stream where the Hopper kernels can run (CC 9.0, a build with them), else skip."""
    ext = runtime.load()
    if torch.cuda.get_device_capability() != (9, 0) or not ext.build_info().get("sm90_gemm"):
        pytest.skip(f"{what} needs a CC 9.0 device and a build with the nvidia-cutlass headers")
    return ext, torch.cuda.current_device(), torch.cuda.current_stream().cuda_stream


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_a_failed_tma_encode_launches_nothing() -> None:
    """CUTLASS only prints a failed cuTensorMapEncodeTiled and launches anyway: under Nsight Compute every encode
    of the GEMM returned 201 and the kernel hit an illegal instruction, which poisons the context for every later
    cell of a sweep. The Hopper GEMM refuses instead (an error naming the encode), writes nothing, and the device
    stays usable: the next call runs and gives the portable path's bits. The Hopper dW fold refuses the same way
    (it said "invalid argument" before). The failure is planted (``_fail_next_tma_encodes``: the next encode fails
    without reaching the driver)."""
    ext, dev, stream = _hopper_ext_or_skip("the Hopper GEMM")
    gen = torch.Generator().manual_seed(5)
    m, n, k = 256, 4096, 4096
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(torch.bfloat16).cuda()
    y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    args = (x.data_ptr(), w.data_ptr(), y.data_ptr(), m, n, k, k, k, n, dev, stream)
    ext._fail_next_tma_encodes(1)
    with pytest.raises(RuntimeError, match=r"cuTensorMapEncodeTiled returned CUresult 1 .*nothing was launched"):
        ext.gemm_nt(*args, 2)
    torch.cuda.synchronize()  # no illegal instruction
    assert torch.isnan(y.float()).all(), "the refused GEMM wrote its output"
    ext.gemm_nt(*args, 2)
    hopper = y.clone()
    ext.gemm_nt(*args, 1)
    torch.cuda.synchronize()
    assert torch.equal(hopper.view(torch.int16), y.view(torch.int16))
    # the Hopper dW fold encodes its own row-window maps: a failed encode is refused the same way, by name
    plan = torch.arange(m, dtype=torch.int32, device="cuda")
    grad = torch.zeros(n, k, dtype=torch.float32, device="cuda")
    fold = (plan.data_ptr(), m // 64, 64, y.data_ptr(), x.data_ptr(), grad.data_ptr(), m, n, k, n, k, k, dev, stream, 2)
    ext._fail_next_tma_encodes(1)
    with pytest.raises(RuntimeError, match=r"gemm_dw_fold: TmaEncodeFailed .*CUresult 1 .*nothing was launched"):
        ext.gemm_dw_fold(*fold)
    torch.cuda.synchronize()
    assert not grad.any(), "the refused fold wrote its main grad"
    ext.gemm_dw_fold(*fold)
    torch.cuda.synchronize()
    assert grad.any()


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_first_call_on_a_thread_without_a_context() -> None:
    """A host thread can have no current CUDA context: torch's autograd device thread before its first kernel (torch
    binds its device lazily) and any new thread. The Hopper GEMM and fold encode their TMA descriptors through the
    driver before any runtime launch, which there failed with CUresult 201 (``TmaEncodeFailed``, seen from
    scripts/bits_dump.py, where our dX GEMM was the backward thread's first kernel). As each thread's first CUDA
    call, the forward, dX and dW fold run and give the bits they give on the main thread."""
    ext, dev, stream = _hopper_ext_or_skip("the Hopper GEMM")
    gen = torch.Generator().manual_seed(7)
    m, n, k = 256, 1024, 512
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16).cuda()
    w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(torch.bfloat16).cuda()
    dy = torch.randn(m, n, generator=gen).to(torch.bfloat16).cuda()
    plan = torch.arange(m, dtype=torch.int32, device="cuda")
    y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    dx = torch.empty(m, k, dtype=torch.bfloat16, device="cuda")
    g = torch.zeros(n, k, dtype=torch.float32, device="cuda")
    calls = {
        "forward": lambda: ext.gemm_nt(x.data_ptr(), w.data_ptr(), y.data_ptr(), m, n, k, k, k, n, dev, stream, 2),
        "dX": lambda: ext.gemm_nn(dy.data_ptr(), w.data_ptr(), dx.data_ptr(), m, k, n, n, k, k, 0, dev, stream, 2),
        "dW fold": lambda: ext.gemm_dw_fold(plan.data_ptr(), m // 64, 64, dy.data_ptr(), x.data_ptr(), g.data_ptr(),
                                            m, n, k, n, k, k, dev, stream, 2),
    }
    outs = {"forward": y, "dX": dx, "dW fold": g}
    bad = []
    for name, call in calls.items():
        outs[name].zero_()
        call()
        torch.cuda.synchronize()
        main = outs[name].clone()
        if name == "dW fold":
            outs[name].zero_()  # the fold adds into its main grad
        else:
            outs[name].fill_(float("nan"))
        torch.cuda.synchronize()
        errors: list[BaseException] = []

        def first_call(call=call, errors=errors) -> None:
            try:
                call()
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=first_call)
        thread.start()
        thread.join()
        torch.cuda.synchronize()
        if errors:
            bad.append(f"{name} on a new thread: {errors[0]}")
        elif not bitwise_compare(outs[name], main).equal:
            bad.append(f"{name} on a new thread: bits differ from the main thread's")
    assert not bad, bad


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_hopper_gemm_equals_the_portable_gemm() -> None:
    """The CUTLASS (wgmma) kernels and the mma.sync kernels give the same bits, for every M configuration
    (bf16 out, and fp32 C += AB, the Hopper epilogue's C + acc rounded once).

    Both run one chain of 16-wide k steps per output element (csrc/gemm_sm90.cuh), so the dispatch by
    device, alignment and M may pick either without moving a bit; a planted difference in either chain
    (a split of K, another step order) fails here. On a CC 9.0 device with a build that has the Hopper
    kernels, path 2 must run (no silent portable path).
    """
    ext, dev, stream = _hopper_ext_or_skip("the Hopper GEMM")
    gen = torch.Generator().manual_seed(11)

    def randn(*shape, scale=1.0):
        return (torch.randn(shape, generator=gen) * scale).to(torch.bfloat16).to("cuda")

    bad = []
    for k, n in ((4096, 4096), (1000, 1032)):
        x, w = randn(8192, k), randn(n, k, scale=k ** -0.5)
        dy = randn(8192, n)
        c0 = torch.randn(8192, k, generator=gen).cuda()
        c0[::5] = -0.0
        outs = {}
        for path in (1, 2):
            y = torch.empty(8192, n, dtype=torch.bfloat16, device="cuda")
            dx = torch.empty(8192, k, dtype=torch.bfloat16, device="cuda")
            for m in (1, 16, 64, 65, 256, 257, 2304, 8192):
                ext.gemm_nt(x.data_ptr(), w.data_ptr(), y.data_ptr(), m, n, k, k, k, n, dev, stream, path)
                ext.gemm_nn(dy.data_ptr(), w.data_ptr(), dx.data_ptr(), m, k, n, n, k, k, 0, dev, stream, path)
                acc = c0.clone()  # out 2: C + AB rounded once (CUTLASS's beta = 1 epilogue, mma.sync's EpiF32Add)
                ext.gemm_nn(dy.data_ptr(), w.data_ptr(), acc.data_ptr(), m, k, n, n, k, k, 2, dev, stream, path)
                outs[(path, m)] = (y[:m].clone(), dx[:m].clone(), acc[:m].clone())
                if not bitwise_compare(acc[m:], c0[m:]).equal:
                    bad.append(f"C += AB path {path} K={k} N={n} M={m}: rows past M were written")
        for m in (1, 16, 64, 65, 256, 257, 2304, 8192):
            for name, i in (("fwd", 0), ("dX", 1), ("C += AB", 2)):
                diff = bitwise_compare(outs[(1, m)][i], outs[(2, m)][i])
                if not diff.equal:
                    bad.append(f"{name} K={k} N={n} M={m}: {diff.mismatched} elements differ between paths")
                rows = bitwise_compare(outs[(2, 8192)][i][:m], outs[(2, m)][i])
                if not rows.equal:
                    bad.append(f"{name} K={k} N={n}: rows of M={m} differ from the same rows at M=8192")
    assert not bad, bad


def _fold_case(gen: torch.Generator, n: int, k: int, rows: int, tiles: int, tile: int, pad_frac: float,
               runs: bool = False):
    """dY [rows, n], X [rows, k] (rows padded to whole 16-byte chunks) with NaN in the rows no plan slot
    reads, and a plan [tiles, tile] with -1 (zero) slots: of permuted rows, or with ``runs`` of consecutive
    rows from an offset (wrapping once), a sixth of the tiles cut short (a sample's last tile)."""
    dy = torch.randn(rows, -(-n // 8) * 8, generator=gen).to(torch.bfloat16)
    x = torch.randn(rows, -(-k // 8) * 8, generator=gen).to(torch.bfloat16)
    slots = tiles * tile
    if runs:
        plan = ((torch.arange(min(slots, rows)) + rows // 3 + 5) % rows).to(torch.int32)
    else:
        plan = torch.randperm(rows, generator=gen)[:slots].to(torch.int32)
    if slots > rows:
        plan = torch.cat([plan, torch.full((slots - rows,), -1, dtype=torch.int32)])
    if runs:
        cut = torch.randint(0, tile, (tiles,), generator=gen)
        short = torch.rand(tiles, generator=gen) < 1 / 6
        plan.view(tiles, tile)[short[:, None] & (torch.arange(tile)[None, :] >= cut[:, None])] = -1
    plan[torch.rand(slots, generator=gen) < pad_frac] = -1
    unread = torch.ones(rows, dtype=torch.bool)
    unread[plan[plan >= 0].long()] = False
    dy[unread], x[unread] = float("nan"), float("nan")
    return dy.cuda(), x.cuda(), plan.view(tiles, tile).cuda()


def _window_fold_case(gen: torch.Generator, n: int, k: int):
    """dY / X of 300 rows (NaN in every row no slot reads) and 8 tiles of 64 slots that the Hopper fold loads
    through its row-window TMA map or, where the window would start before row 0, by cp.async: short tiles
    read in place (5 rows at row 0, 40 rows at row 60, 1 row at row 164), whole tiles, an all -1 tile, a short
    tile right before the tensor's last row, and a tile whose -1 slot sits inside (not a window)."""
    dy = torch.randn(300, -(-n // 8) * 8, generator=gen).to(torch.bfloat16)
    x = torch.randn(300, -(-k // 8) * 8, generator=gen).to(torch.bfloat16)
    plan = torch.full((8, 64), -1, dtype=torch.int32)
    for t, (first, count) in enumerate(((0, 5), (60, 40), (100, 64), (164, 1), (165, 64), (0, 0), (290, 10))):
        plan[t, :count] = torch.arange(first, first + count, dtype=torch.int32)
    plan[7] = torch.arange(229, 293, dtype=torch.int32)
    plan[7, 17] = -1
    unread = torch.ones(300, dtype=torch.bool)
    unread[plan[plan >= 0].long()] = False
    dy[unread], x[unread] = float("nan"), float("nan")
    return dy.cuda(), x.cuda(), plan.cuda()


def _fold_tiles(target, path: int, plan: torch.Tensor, dy: torch.Tensor, x: torch.Tensor, n: int, k: int,
                grad: torch.Tensor) -> None:
    """gemm_dw_fold of the plan's tiles (a [tiles, tile] slice) into grad [n, k], by kernel path ``path``;
    ``target`` is _hopper_ext_or_skip's (extension, device, stream)."""
    ext, dev, stream = target
    plan = plan.contiguous()
    ext.gemm_dw_fold(plan.data_ptr(), plan.shape[0], plan.shape[1], dy.data_ptr(), x.data_ptr(), grad.data_ptr(),
                     x.shape[0], n, k, dy.stride(0), x.stride(0), k, dev, stream, path)


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_hopper_fold_equals_the_portable_fold() -> None:
    """The wgmma fold (gemm_fold_sm90.cu) and the mma.sync fold give the same bits, split or not.

    Both start from the loaded main grad and run one 16-slot step after another over the plan, so the
    dispatch may pick either without moving a bit. Cases: full 128 x 256 tiles, ragged N / K (a partial
    16-byte chunk at the edge of a row, tiles past the edge), a plan whose length is not a multiple of the
    64-slot stage (its last steps), -1 slots and NaN rows that no slot reads, a main grad with -0.0
    entries, plans of consecutive rows (the stages the Hopper fold loads by TMA, its out-of-bounds columns
    zero-filled) mixed with short tiles read in place (TMA row windows, their zero rows out of bounds: a NaN
    row after the tile would show) and wrapping stages (gathered by cp.async); and a fold split across two
    calls (the canonical chunked call) equals the fold in one call. The main grad's three access paths of the
    Hopper fold are all here: 16-byte row chunks (K a multiple of 4), 8-byte pairs (K = 1030), one element at a
    time (K = 135). N = 330 gives an odd number of 128-row tiles (a kernel that pairs row tiles, say in a cluster
    sharing the X stages, has a tile past N to fold and never store). A planted defect in
    the stage pipeline (a stage read before it lands, a slot refilled too early) or in the gather moves
    bits against the mma.sync fold here; the float64 check (the contract's dW rule against its FP32 stock
    fold) guards against both paths being wrong alike.
    """
    target = _hopper_ext_or_skip("the Hopper fold")
    gen = torch.Generator().manual_seed(12)
    rule = load_contract(MANIFEST_DIR / "contract.yaml").resolve(
        CheckKind.GRADIENT_ACCURACY, "det_gemm", "dW", "bfloat16", "cuda_bf16")
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    bad = []
    # (N, K, rows, tiles, tile, fraction of -1 slots, runs of consecutive rows)
    shapes = ((512, 1024, 4096, 64, 64, 0.0, False), (1001, 1030, 1500, 45, 32, 0.1, False),
              (136, 264, 300, 21, 16, 0.3, False), (4096, 4096, 4096, 256, 16, 0.0, False),
              (512, 1024, 4096, 64, 64, 0.0, True), (1001, 1030, 1500, 45, 32, 0.0, True),
              (200, 72, 130, 3, 64, 0.0, True), (4096, 4096, 4096, 64, 64, 0.0, True),
              (130, 135, 300, 5, 64, 0.0, True), (330, 520, 700, 12, 64, 0.0, True),
              (330, 520, 700, 20, 32, 0.1, False))
    cases = [(n, k, tiles, tile, _fold_case(gen, n, k, rows, tiles, tile, pad, runs))
             for n, k, rows, tiles, tile, pad, runs in shapes]
    cases += [(n, k, 8, 64, _window_fold_case(gen, n, k)) for n, k in ((256, 512), (1001, 1030), (330, 520))]
    for n, k, tiles, tile, (dy, x, plan) in cases:
        g0 = torch.randn(n, k, generator=gen)
        g0[torch.rand(n, k, generator=gen) < 0.05] = -0.0
        g0 = g0.cuda()

        outs = {}
        for path in (1, 2):
            whole = g0.clone()
            _fold_tiles(target, path, plan, dy, x, n, k, whole)
            split = g0.clone()
            _fold_tiles(target, path, plan[: tiles // 3], dy, x, n, k, split)
            _fold_tiles(target, path, plan[tiles // 3:], dy, x, n, k, split)
            outs[path] = whole
            if not bitwise_compare(whole, split).equal:
                bad.append(f"path {path} N={n} K={k}: a fold split across two calls differs from one call")
        diff = bitwise_compare(outs[1], outs[2])
        if not diff.equal:
            bad.append(f"N={n} K={k} tile={tile}: {diff.mismatched} elements differ between the folds")
        flat = plan.reshape(-1).long()
        rows_dy, rows_x = dy[flat[flat >= 0], :n], x[flat[flat >= 0], :k]
        ref = g0.double() + rows_dy.double().t() @ rows_x.double()
        stock = g0 + rows_dy.float().t() @ rows_x.float()  # the contract's FP32-class stock (TF32 off)
        error = normwise_error(outs[2], ref, start=g0)
        bound = rule.bound(normwise_error(stock, ref, start=g0))
        if not error <= bound:
            bad.append(f"N={n} K={k}: error {error:.3g} against float64 above the contract's {bound:.3g}")
    torch.backends.cuda.matmul.allow_tf32 = tf32
    assert not bad, bad


def _llp_case(gen: torch.Generator, rows: int, vocab: int, k: int):
    """hidden [rows, k], weight [vocab, k] (logits of a few units), targets with -1, out-of-range and last-column
    entries, g with a zero."""
    h = (torch.randn(rows, k, generator=gen)).to(torch.bfloat16)
    w = (torch.randn(vocab, k, generator=gen) * 2 * k ** -0.5).to(torch.bfloat16)
    t = torch.randint(0, vocab, (rows,), generator=gen)
    t[::7] = -1
    t[3::11] = vocab + 5
    t[5::13] = vocab - 1
    g = torch.randn(rows, generator=gen)
    g[::9] = 0.0
    return h.cuda(), w.cuda(), t.cuda(), g.cuda()


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_hopper_linear_logp_equals_the_portable_kernel() -> None:
    """linear_logp's Hopper path (CUTLASS fp32 logits into a scratch, then the row-local reduction or the
    dlogits formula) and the mma.sync kernels (which reduce in registers) give the same bits.

    The scratch holds the very accumulators of the mma.sync mainloop and the reduction runs the same blocks,
    lane order and butterfly, so the dispatch may pick either; the slab width (the scratch's columns, set by
    R) must not move a bit either: slabs of one chunk, two chunks and the whole vocabulary agree, and the rows
    of a large R equal the same rows alone. A planted difference (another lane order, a slab boundary that
    restarts a chunk, logits rounded before the reduction) fails here. Where TMA cannot store the scratch's
    rows (a vocabulary or chunk width not a multiple of 4 floats) path 2 is refused by name and the automatic
    choice runs the mma.sync kernel.
    """
    ext, dev, stream = _hopper_ext_or_skip("linear_logp's Hopper path")
    gen = torch.Generator().manual_seed(13)
    chunk = int(ext.LLP_VCHUNK)
    bad = []
    for rows, vocab, k in ((2304, 40000, 1024), (300, 5000, 4096), (1, 2052, 256)):
        h, w, t, g = _llp_case(gen, rows, vocab, k)
        n_chunks = -(-vocab // chunk)
        results = {}
        for label, path, cols in (("mma.sync", 1, 0), ("one chunk", 2, chunk), ("two chunks", 2, 2 * chunk),
                                  ("whole", 2, n_chunks * chunk)):
            for m in (rows, 1):
                out = torch.empty(m, device="cuda")
                lse = torch.empty(m, device="cuda")
                part = torch.empty(3 * n_chunks * m, device="cuda")
                scratch = torch.empty(m * cols, device="cuda") if cols else None
                ext.llp_forward(h.data_ptr(), w.data_ptr(), t.data_ptr(), part.data_ptr(), out.data_ptr(),
                                lse.data_ptr(), m, vocab, k, k, k, scratch.data_ptr() if cols else 0, cols, dev,
                                stream, path)
                results[(label, m)] = (out, lse)
        for key, (out, lse) in results.items():
            ref_out, ref_lse = results[("mma.sync", key[1])]
            for name, a, b in (("logp", out, ref_out), ("lse", lse, ref_lse)):
                if not bitwise_compare(a, b).equal:
                    bad.append(f"forward {key} R={rows} V={vocab} K={k}: {name} differs from the mma.sync kernel")
            if key[1] == 1 and not bitwise_compare(out, results[(key[0], rows)][0][:1]).equal:
                bad.append(f"forward {key[0]} V={vocab}: row 0 alone differs from row 0 of R={rows}")
        # dlogits of a vocabulary chunk (ragged width, offset v0) against the lse of the forward
        lse = results[("mma.sync", rows)][1]
        for v0, n in ((0, 4096), (vocab - 1004, 1004)):
            w_c = w[v0:v0 + n]
            outs = {}
            for path in (1, 2):
                d = torch.empty(rows, n, dtype=torch.bfloat16, device="cuda")
                cols = -(-n // 8) * 8
                scratch = torch.empty(rows * cols, device="cuda")
                ext.llp_dlogits(h.data_ptr(), w_c.data_ptr(), t.data_ptr(), lse.data_ptr(), g.data_ptr(),
                                d.data_ptr(), rows, n, k, v0, vocab, k, k, n,
                                scratch.data_ptr() if path == 2 else 0, cols, dev, stream, path)
                outs[path] = d
            diff = bitwise_compare(outs[1], outs[2])
            if not diff.equal:
                bad.append(f"dlogits R={rows} V={vocab} v0={v0} N={n}: {diff.mismatched} elements differ")
    # a vocabulary TMA cannot store by rows: path 2 refused, the automatic path is the mma.sync kernel
    h, w, t, g = _llp_case(gen, 64, 2049, 256)
    n_chunks = -(-2049 // chunk)
    got = {}
    for path in (0, 1, 2):
        out, lse = torch.empty(64, device="cuda"), torch.empty(64, device="cuda")
        part, scratch = torch.empty(3 * n_chunks * 64, device="cuda"), torch.empty(64 * 2 * chunk, device="cuda")
        args = (h.data_ptr(), w.data_ptr(), t.data_ptr(), part.data_ptr(), out.data_ptr(), lse.data_ptr(), 64, 2049,
                256, 256, 256, scratch.data_ptr(), 2 * chunk, dev, stream, path)
        if path == 2:
            with pytest.raises(RuntimeError, match="llp_forward"):
                ext.llp_forward(*args)
            continue
        ext.llp_forward(*args)
        got[path] = out
    if not bitwise_compare(got[0], got[1]).equal:
        bad.append("V=2049: the automatic path differs from the mma.sync kernel")
    assert not bad, bad


@pytest.mark.gpu
@needs_cuda_kernels
def test_gpu_logp_forward_special_values_and_tails() -> None:
    """The forward's exponentials run on the special-function unit (ex2): rows with -inf entries, a NaN, a +inf,
    every entry -inf, a vocabulary that is not a multiple of 8 (the partial last chunk, element loads) and a row
    whose first chunks are all -inf before a NaN give what log_softmax in float64 gives (NaN where it is NaN), and
    targets outside [0, V) give 0."""
    from gradsweep.cuda_kernels.logp import logp_forward

    gen = torch.Generator().manual_seed(11)
    contract = load_contract(MANIFEST_DIR / "contract.yaml")
    rule = contract.resolve(CheckKind.FORWARD_ACCURACY, "logp", "logp", "bfloat16", "cuda_bf16",
                            contract.accumulation_class("logp", "logp", "cuda"))
    for vocab in (4096, 5003):
        x = (torch.randn(8, vocab, generator=gen) * 4).to(torch.bfloat16)
        x[1, ::3] = float("-inf")
        x[2, 17] = float("nan")
        x[3, 5] = float("inf")
        x[4, :] = float("-inf")
        x[5, : vocab // 2] = float("-inf")
        x[5, vocab // 2 + 1] = float("nan")
        t = torch.randint(0, vocab, (8,), generator=gen)
        t[1] = 1  # a finite entry (1 % 3 != 0)
        t[6], t[7] = -100, vocab
        got, _ = logp_forward(x.cuda(), t.cuda())
        got = got.cpu().double()
        want = torch.log_softmax(x.double(), -1).gather(1, t.clamp(0, vocab - 1)[:, None]).squeeze(1)
        want[6:] = 0.0
        stock = torch.log_softmax(x.float(), -1).gather(1, t.clamp(0, vocab - 1)[:, None]).squeeze(1).double()
        stock[6:] = 0.0
        assert torch.equal(torch.isnan(got), torch.isnan(want)), (vocab, got, want)
        ok = ~torch.isnan(want)
        error = normwise_error(got[ok], want[ok])
        bound = rule.bound(normwise_error(stock[ok], want[ok]))  # the contract's FP32-class rule for logp
        assert error <= bound, (vocab, error, bound)
