"""Triton GEMM / lm_head / logp / linear_logp (issue 5) under TRITON_INTERPRET=1 on the CPU.

Accuracy and bitwise invariance of every op on every layout of the default manifest are judged by the
sweep's own machinery (tests/test_ops_cells.py, the contract's bounds). Here: bitwise M-independence of
rows, the dW fold's bits following tiles and not storage, planted defects (split-K, a vocabulary block that
follows M, dW summed per call) that must break those checks, and linear_logp never allocating [R, V].
No tolerance lives here.
"""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.harness.kernel_check import candidate_from, check_kernel
from gradsweep.ops.base import CallContext, CallOutput
from gradsweep.results import Status
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels import linear_logp as ll
from gradsweep.triton_kernels import logp as lp
from gradsweep.triton_kernels.lm_head import lm_head
from tests.helpers import run_compiled

K, N, V = 48, 80, 300
MS = (1, 2, 3, 7, 16, 64, 256, 1000)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def gen(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).bfloat16()


W = gen(1, N, K, scale=0.3)
WV = gen(2, V, K, scale=0.3)
MG0 = torch.randn(N, K, generator=torch.Generator().manual_seed(3))  # non-zero main grad: it must be LOADED


def m_independent(fn, inputs: list[torch.Tensor], ms=MS, alone=(0, -1)) -> bool:
    """Each row of fn on the first M rows equals that row in the full batch and computed alone."""
    full = fn(*inputs)
    for m in ms:
        part = fn(*(t[:m] for t in inputs))
        if not same(part, full[:m]):
            return False
    for i in alone:
        i = i % inputs[0].shape[0]
        if not same(fn(*(t[i:i + 1] for t in inputs)), full[i:i + 1]):
            return False
    return True


BIG = max(MS)
XB = gen(21, BIG, K)
DYB = gen(22, BIG, N)
LB = gen(23, BIG, V, scale=3.0)
TB = torch.randint(0, V, (BIG,), generator=torch.Generator().manual_seed(24))
GB = torch.randn(BIG, generator=torch.Generator().manual_seed(25))


def test_m_independence_gemm():
    assert m_independent(lambda x: gemm.matmul_invariant(x, W), [XB])
    assert m_independent(lambda dy: gemm.matmul_invariant(dy, W.t()), [DYB])


def test_m_independence_logp():
    assert m_independent(lambda lg, t: lp.logp_forward(lg, t)[0], [LB, TB])

    def dlogits(lg, t, g):
        return lp.logp_backward(lg, t, lp.logp_forward(lg, t)[1], g)
    assert m_independent(dlogits, [LB[:256], TB[:256], GB[:256]], ms=(1, 3, 64))


def test_m_independence_linear_logp():
    h = XB * 0.3
    assert m_independent(lambda x, t: ll.fused_forward(x, WV, t)[0], [h, TB])

    def dhidden(x, t, g):
        x = x.clone().requires_grad_()
        ll.linear_logp(x, WV, t, RowIdentity.packed([x.shape[0]]), None).backward(g)
        return x.grad
    assert m_independent(dhidden, [h[:256], TB[:256], GB[:256]], ms=(1, 7, 64), alone=(-1,))


def test_dw_fold_bits_follow_tiles_not_storage():
    """One canonical tile sequence read in place, from staging storage holding the tiles in another order,
    and split between two launches: the same bits (a descriptor only moves addresses)."""
    tile, n_tiles = gemm.TILE, 4
    x, dy = gen(31, n_tiles * tile, K), gen(32, n_tiles * tile, N)
    counts = [tile, 40, tile, tile]  # tile 1 is a sample's last tile: slots 40.. are zero rows
    desc = torch.tensor([[t * tile, c] for t, c in enumerate(counts)], dtype=torch.int32)
    a = gemm.dw_fold_tiles(desc, x, dy, MG0.clone())
    where = [2, 0, 3, 1]  # tile t sits in staging block where[t]
    xs, dys = torch.empty_like(x), torch.empty_like(dy)
    for t, b in enumerate(where):
        xs[b * tile:(b + 1) * tile] = x[t * tile:(t + 1) * tile]
        dys[b * tile:(b + 1) * tile] = dy[t * tile:(t + 1) * tile]
    staged = torch.tensor([[-b * tile - 1, c] for b, c in zip(where, counts)], dtype=torch.int32)
    mixed = torch.where(torch.arange(n_tiles)[:, None] % 2 == 1, staged, desc)
    b = gemm.dw_fold_tiles(staged, x[:0], dy[:0], MG0.clone(), xs, dys)
    c = gemm.dw_fold_tiles(mixed, x, dy, MG0.clone(), xs, dys)
    d = gemm.dw_fold_tiles(desc[2:], x, dy, gemm.dw_fold_tiles(desc[:2], x, dy, MG0.clone()))
    assert same(a, b) and same(a, c) and same(a, d)
    garbage = x.clone()
    garbage[tile + 40:2 * tile] = float("nan")  # the zero slots of tile 1 are never read
    assert same(a, gemm.dw_fold_tiles(desc, garbage, dy, MG0.clone()))
    assert not same(a, gemm.dw_fold_tiles(desc[[1, 0, 2, 3]], x, dy, MG0.clone()))  # the order of tiles matters



def test_dw_stretches_cut_the_tiles_by_how_they_are_read():
    """The TMA fold's host plan: windows of the call's rows, windows of the staging rows, and the gather for a
    window that would start before its source's first row; order kept, every tile in exactly one stretch."""
    tile = gemm.TILE
    host = torch.tensor([[0, 5], [5, tile], [69, 40], [-1, 40], [-tile - 1, tile], [-2 * tile - 1, 3], [200, tile],
                         [30, 34], [29, 34]], dtype=torch.int32).numpy()
    got = gemm.stretches(host, tile)
    assert got == [(0, 1, gemm.GATHER), (1, 3, gemm.TMA_ROWS), (3, 4, gemm.GATHER), (4, 6, gemm.TMA_STAGED),
                   (6, 8, gemm.TMA_ROWS), (8, 9, gemm.GATHER)]


def test_dw_stretches_are_kept_only_for_a_read_only_plan():
    """``stretches`` keeps its last answer for a read-only descriptor array (the fold plan cache's, frozen): a
    caller's writable array is cut again on every call, so an array changed in place between two calls gets the new
    stretches; the plan's own arrays are read-only."""
    tile = gemm.TILE
    host = np.array([[5, tile], [69, 40]], dtype=np.int32)
    assert gemm.stretches(host, tile) == [(0, 2, gemm.TMA_ROWS)]
    host[0] = (0, 5)  # now a short tile at row 0: the gather
    assert gemm.stretches(host, tile) == [(0, 1, gemm.GATHER), (1, 2, gemm.TMA_ROWS)]
    host.setflags(write=False)
    assert gemm.stretches(host, tile) is gemm.stretches(host, tile)
    assert gemm.stretches(host.copy(), tile) == [(0, 1, gemm.GATHER), (1, 2, gemm.TMA_ROWS)]
    lengths = (70, 3, 64)
    step = CanonicalFold(torch.zeros(4, 4), lengths, tile).take_tiles(RowIdentity.packed(list(lengths)),
                                                                      (torch.zeros(137, 4), torch.zeros(137, 4)))
    assert not step.host_desc.flags.writeable


# ---------------------------------------------------------------- planted defects are caught

def test_tma_tiles_by_row_count():
    """The TMA GEMM's tile table: rows ordered by least M, the first at TMA_MIN_M, each M served by the last row
    it reaches (the boundaries the GPU test's M list straddles); below TMA_MIN_M there is no TMA tile."""
    leasts = [least for least, *_ in gemm._TMA_TILES]
    assert leasts == sorted(set(leasts)) and leasts[0] == gemm.TMA_MIN_M
    for i, (least, cfg, warps, stages) in enumerate(gemm._TMA_TILES):
        upper = gemm._TMA_TILES[i + 1][0] - 1 if i + 1 < len(gemm._TMA_TILES) else 1 << 20
        for m in (least, upper):
            assert gemm._tma_tiles(m) == (cfg, warps, stages), m
    with pytest.raises(ValueError, match="M >= "):
        gemm._tma_tiles(gemm.TMA_MIN_M - 1)


def test_planted_split_k_is_caught():
    def split_k(x):  # split-K whose presence depends on M: fp32 partials summed
        if x.shape[0] < 8:
            return gemm.matmul_invariant(x, W, torch.float32)
        return (gemm.matmul_invariant(x[:, :24], W[:, :24], torch.float32)
                + gemm.matmul_invariant(x[:, 24:], W[:, 24:], torch.float32))
    ms = (1, 7, 64, 256)
    assert m_independent(lambda x: gemm.matmul_invariant(x, W, torch.float32), [XB[:256]], ms)
    assert not m_independent(split_k, [XB[:256]], ms)


def test_planted_vocab_block_following_m_is_caught(monkeypatch):
    def logp_block_follows_m(lg, t):
        monkeypatch.setattr(lp, "BLOCK_V", 64 if lg.shape[0] > 256 else 4096)
        return lp.logp_forward(lg, t)[0]
    assert not m_independent(logp_block_follows_m, [LB, TB])


class _PerCallDW(torch.autograd.Function):
    """PLANTED DEFECT: dW of each call as one GEMM over its real rows, added to the main grad (not folded in
    canonical tiles); y and dX as the real kernel's, the fold's bookkeeping kept, so only the order is wrong."""

    @staticmethod
    def forward(ctx, x, w, rows, fold):  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.rows, ctx.fold = rows, fold
        return gemm.matmul_invariant(x, w)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, w = ctx.saved_tensors
        real = ctx.rows.sample >= 0
        ctx.fold.main_grad += gemm.matmul_invariant(dy[real].t().contiguous(), x[real].t().contiguous(),
                                                    torch.float32)
        ctx.fold.take_tiles(ctx.rows, ())
        return gemm.matmul_invariant(dy.contiguous(), w.t()), None, None, None


def _per_call_dw(ctx: CallContext) -> CallOutput:
    return CallOutput({"y": _PerCallDW.apply(ctx.inputs["x"], ctx.params["W"], ctx.rows, ctx.fold("W"))})


def test_planted_per_call_dw_is_red_where_a_call_is_split():
    planted = candidate_from("det_gemm", "planted.per_call_dw", "triton", _per_call_dw, param_grads="fold",
                             fold_tiles=lambda: {"W": gemm.TILE})
    report = check_kernel("det_gemm", planted, layouts=["bn_full", "bn_chunked", "b1_singleton"])
    reds = {lay for lay, s in report.statuses().items() if s != Status.GREEN}
    assert reds == {"bn_chunked", "b1_singleton"}, report.statuses()
    assert "dW gradient_invariance" in report.cells["b1_singleton"].first_failure


# ---------------------------------------------------------------- memory, edge cases, hygiene

class _BigAllocs(TorchDispatchMode):
    """Records every floating tensor an op produces with at least ``limit`` elements.

    (The interpreter's own byte copies of kernel arguments are uint8 storages: not counted.)
    """

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit, self.seen = limit, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() >= self.limit:
                self.seen.append((str(func), tuple(t.shape)))
        return out


def test_linear_logp_never_materialises_logits():
    r = 130
    h = (XB[:r] * 0.3).requires_grad_()
    w = WV.clone().requires_grad_()
    assert V > ll.BWD_VCHUNK  # the backward really walks the vocabulary in chunks
    limit = r * V // 2  # above every legitimate buffer: [r, chunk], [V, K], [r, K]
    fold = CanonicalFold(torch.zeros(V, K), [r], gemm.TILE)
    with _BigAllocs(limit) as mode:
        ll.linear_logp(h, w, TB[:r], RowIdentity.packed([r]), fold).sum().backward()
    assert mode.seen == [], mode.seen
    assert h.grad is not None and fold.done
    # the detector works: the unfused path allocates [R, V] logits
    with _BigAllocs(limit) as mode:
        lp.selected_logp(lm_head(h.detach(), WV, RowIdentity.packed([r]), None), TB[:r])
    assert any(shape == (r, V) for _, shape in mode.seen)


def test_empty_and_errors():
    fold = CanonicalFold(torch.zeros(N, K), [], gemm.TILE)
    x = torch.zeros(0, K, dtype=torch.bfloat16, requires_grad=True)
    w = W.clone().requires_grad_()
    y = gemm.det_linear(x, w, RowIdentity.packed([]), fold)
    assert y.shape == (0, N)
    y.sum().backward()
    assert x.grad.shape == (0, K) and fold.done
    empty = torch.zeros(0, V, dtype=torch.bfloat16)
    assert lp.selected_logp(empty, torch.zeros(0, dtype=torch.int64)).shape == (0,)
    out = ll.linear_logp(torch.zeros(0, K, dtype=torch.bfloat16), WV, torch.zeros(0, dtype=torch.int64),
                         RowIdentity.packed([]), None)
    assert out.shape == (0,)
    with pytest.raises(ValueError, match="fold"):
        gemm.det_linear(XB[:3], w, RowIdentity.packed([3]), None)
    with pytest.raises(ValueError, match="fold"):
        ll.linear_logp(XB[:3], WV.clone().requires_grad_(), TB[:3], RowIdentity.packed([3]), None)


_GPU_SCRIPT = """
import torch
from gradsweep.triton_kernels import gemm, logp as lp, linear_logp as ll
torch.manual_seed(0)
x = torch.randn(4096, 512, device="cuda").bfloat16()
w = (torch.randn(1000, 512, device="cuda") * .05).bfloat16()
t = torch.randint(0, 1000, (4096,), device="cuda")
dy = torch.randn(4096, 1000, device="cuda").bfloat16()
def bits(a):
    return a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32)
fns = {"fwd": lambda n: gemm.matmul_invariant(x[:n], w),
       "fwd_fp32_out": lambda n: gemm.matmul_invariant(x[:n], w, out_dtype=torch.float32),
       "dx": lambda n: gemm.matmul_invariant(x[:n, :500], w[:500].t()),
       "dx_contiguous": lambda n: gemm.matmul_invariant(dy[:n], w.t()),
       "logp": lambda n: lp.logp_forward(x[:n], t[:n])[0],
       "linear_logp": lambda n: ll.fused_forward(x[:n], w, t[:n])[0]}
# M >= gemm.TMA_MIN_M runs the persistent TMA kernel (tiles by M: gemm._TMA_TILES), smaller M _mm_kernel: rows
# must not tell any of them apart
assert gemm._tma_ok(x, w.t(), torch.empty(4096, 1000, device="cuda", dtype=torch.bfloat16))
assert gemm._tma_ok(dy, w, torch.empty(4096, 512, device="cuda", dtype=torch.bfloat16))  # dX: B = W itself
assert gemm._tma_ok(x[:256], w.t(), torch.empty(256, 1000, device="cuda", dtype=torch.bfloat16))
assert not gemm._tma_ok(x[:255], w.t(), torch.empty(255, 1000, device="cuda", dtype=torch.bfloat16))
for name, f in fns.items():
    full = f(4096)
    for m in (1, 2, 3, 7, 16, 64, 255, 256, 257, 511, 512, 767, 768, 1000, 1023, 1024, 1031, 2912):
        assert torch.equal(bits(f(m)), bits(full[:m])), (name, m)
print("GPU-OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_m_independence_gpu():
    """The compiled kernels (no interpreter) on the GPU, M up to 4096, in a clean process."""
    res = run_compiled(_GPU_SCRIPT, timeout=900)
    assert "GPU-OK" in res.stdout, res.stdout + res.stderr


_GPU_DW_SCRIPT = """
import torch
from gradsweep.triton_kernels import gemm
T = gemm.TILE
g = torch.Generator().manual_seed(4)
def bits(a):
    return a.view(torch.int32)
def pinned(i):  # one configuration for both kernels: the comparison is kernel against kernel
    return lambda key: [gemm.dw_configs(key)[i]]
replays = []  # what each whole-call replay attempt returned (the replay case below must replay)
real_replay = gemm._DW_TMA.launch.replay_all
def counted(keys):
    replays.append(real_replay(keys))
    return replays[-1]
gemm._DW_TMA.launch.replay_all = counted
for n, k, rows in ((4096, 4096, 3000), (1000, 1032, 700)):
    x, dy = torch.randn(rows, k, generator=g).bfloat16(), torch.randn(rows, n, generator=g).bfloat16()
    xs, dys = torch.randn(4 * T, k, generator=g).bfloat16(), torch.randn(4 * T, n, generator=g).bfloat16()
    # (staged, first row, count): short tiles at row 0 of both sources (their windows start before it), whole
    # tiles, a one-row tile, a short tile ending at the last row, stretches of one source and alternations
    tiles = [(0, 0, 5), (0, 5, T), (1, 0, 40), (1, T, T), (0, 69, T), (0, 133, 1), (1, 2 * T, 3), (0, rows - 10, 10),
             (0, 200, T), (1, 3 * T, T), (1, 3 * T + 1, 17), (0, 300, 50)]
    host = torch.tensor([[-f - 1 if s else f, c] for s, f, c in tiles], dtype=torch.int32).numpy()
    for src, flag in ((x, 0), (dy, 0), (xs, 1), (dys, 1)):  # NaN in every row no tile reads
        read = torch.zeros(src.shape[0], dtype=torch.bool)
        for s, f, c in tiles:
            if s == flag:
                read[f:f + c] = True
        src[~read] = float("nan")
    mg = torch.randn(n, k, generator=g)
    mg[torch.rand(n, k, generator=g) < 0.05] = -0.0
    x, dy, xs, dys, mg = (t.cuda() for t in (x, dy, xs, dys, mg))
    desc = torch.from_numpy(host).cuda()
    assert gemm.tma_rows_ok(x, dy, xs, dys)
    outs = {}
    for i in (0, 4):
        gemm._DW.configs = gemm._DW_TMA.configs = pinned(i)
        gemm._DW.best.clear()
        gemm._DW_TMA.best.clear()
        outs["gather", i] = gemm.dw_fold_tiles(desc, x, dy, mg.clone(), xs, dys)
        outs["tma", i] = gemm.dw_fold_tiles(desc, x, dy, mg.clone(), xs, dys, host)
        part = gemm.dw_fold_tiles(desc[:5], x, dy, mg.clone(), xs, dys, host[:5])
        outs["tma split", i] = gemm.dw_fold_tiles(desc[5:], x, dy, part, xs, dys, host[5:])
    # a replayed plan (read-only host descriptors, as the plan cache hands them) folded again into the same
    # buffers: the memoised launches run again (a replay); the bits must not move, and a source changed in place
    # (same address, new values) must be read anew, as the gather fold reads it
    ro = host.copy()
    ro.setflags(write=False)
    acc = mg.clone()
    replays.clear()
    for r in range(3):
        acc.copy_(mg)
        outs["tma replay", r] = gemm.dw_fold_tiles(desc, x, dy, acc, xs, dys, ro).clone()
    assert any(replays), (n, k, "the replayed plan was never replayed", replays)
    ref = outs["gather", 0]
    assert torch.isfinite(ref).all() and not torch.equal(ref, mg)
    for key, out in outs.items():
        assert torch.equal(bits(out), bits(ref)), (n, k, key, int((bits(out) != bits(ref)).sum()))
    dy.mul_(2.0)
    acc.copy_(mg)
    again = gemm.dw_fold_tiles(desc, x, dy, acc, xs, dys, ro)
    fresh = gemm.dw_fold_tiles(desc, x, dy, mg.clone(), xs, dys)
    assert torch.equal(bits(again), bits(fresh)) and not torch.equal(bits(again), bits(ref)), (n, k, "in place")
print("GPU-OK")
"""


def test_linear_logp_tma_kernels_equal_the_pointer_kernels():
    """The forward and the backward's dlogits by TMA (Hopper: host descriptors, out-of-range rows and K columns as
    zeros) give the pointer kernels' bits: every R here is a partial row tile, K (48) is shorter than one K block,
    V ends inside a block. The interpreter runs both kernels; the GPU test below compares them at release shapes."""
    h = XB[:300] * 0.3
    for r in (1, 5, 129, 300):
        ref = ll.fused_forward(h[:r], WV, TB[:r], tma=False)
        got = ll.fused_forward(h[:r], WV, TB[:r], tma=True)
        assert all(same(a, b) for a, b in zip(ref, got)), r
    lse = ll.fused_forward(h, WV, TB[:300])[1]
    for v0 in (0, 128, 256):  # the backward's dlogits by TMA: the last chunk ends inside a block
        args = (h, WV[v0:v0 + 128], TB[:300], lse, GB[:300], v0, V)
        assert same(ll.dlogits_chunk(*args, tma=False), ll.dlogits_chunk(*args, tma=True)), v0


def test_linear_logp_program_order_does_not_touch_the_bits():
    """The forward's (row tile, vocabulary chunk) programs may run in any order (GROUP_M: the L2 grouping, a speed
    choice): each writes its own partials, so rows-fastest, grouped and chunks-fastest orders give the same bits,
    by the pointer and the TMA kernel. A program that read another's partials would fail here."""
    h = XB[:300] * 0.3
    ref = ll.fused_forward(h, WV, TB[:300], tma=False)
    for group in (1, 2, 1 << 20):  # chunks fastest, pairs of row tiles, every row tile of a chunk at once
        for tma in (False, True):
            got = ll.fused_forward(h, WV, TB[:300], cfg={**ll.FWD_CFG, "GROUP_M": group}, tma=tma)
            assert all(same(a, b) for a, b in zip(ref, got)), (group, tma)


_GPU_FWD_SCRIPT = """
import torch
from gradsweep.triton_kernels import linear_logp as ll
g = torch.Generator().manual_seed(5)
def bits(a):
    return a.view(torch.int32)
for k, v in ((4096, 32017), (1032, 5000)):  # V ends inside a block; K = 1032 ends inside a K block
    h = (torch.randn(4100, k, generator=g) * 0.05).bfloat16().cuda()
    w = (torch.randn(v, k, generator=g) * 0.05).bfloat16().cuda()
    t = torch.randint(-1, v, (4100,), generator=g).cuda()
    assert ll._use_tma(None, h, w)
    full = ll.fused_forward(h, w, t, tma=False)
    for r in (1, 3, 127, 128, 1000, 4100):
        for tma in (False, True):
            got = ll.fused_forward(h[:r], w, t[:r], tma=tma)
            for a, b in zip(got, full):
                assert torch.equal(bits(a), bits(b[:r])), (k, v, r, tma, int((bits(a) != bits(b[:r])).sum()))
    assert torch.isfinite(full[1]).all()
    gr = torch.randn(4100, generator=g).cuda()
    for v0 in (0, v - v % 8192 if v > 8192 else 0):
        wc = w[v0:v0 + 8192]
        d = {tma: ll.dlogits_chunk(h, wc, t, full[1], gr, v0, v, tma=tma) for tma in (False, True)}
        assert torch.equal(d[False].view(torch.int16), d[True].view(torch.int16)), (k, v, v0)
print("GPU-OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_linear_logp_tma_kernels_equal_the_pointer_kernels_gpu():
    """On the GPU the TMA forward (shipped on Hopper) and the pointer forward (other GPUs, rows TMA cannot read) give
    the same bits for every R, each row equal to that row of the full batch; the backward's dlogits the same, on a
    first and a last vocabulary chunk: two shapes whose K and V end inside a block, targets out of range included."""
    res = run_compiled(_GPU_FWD_SCRIPT, timeout=900)
    assert "GPU-OK" in res.stdout, res.stdout + res.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_dw_tma_fold_equals_the_gather_fold_gpu():
    """On a Hopper GPU ``dw_fold`` reads tiles by TMA through row-window descriptors whose out-of-bounds rows are
    a short tile's zero rows, one launch per stretch of tiles of one source; elsewhere (and without host
    descriptors) the masked gather. Both must give the same bits, in one launch or split, at two tile
    configurations: short tiles at row 0 of the call's rows and of the staging rows, one-row tiles, a tile ending
    at the last row, stretches and alternations of the two sources, NaN in every row no tile reads (a window
    that read past its tile would show), a main grad with -0.0 entries."""
    res = run_compiled(_GPU_DW_SCRIPT, timeout=900)
    assert "GPU-OK" in res.stdout, res.stdout + res.stderr
