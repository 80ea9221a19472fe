"""Triton GEMM / lm_head / logp / linear_logp (issue 5) under TRITON_INTERPRET=1 on the CPU.

Accuracy against float64 torch (bounds from the bf16 output rounding and the fp32 accumulation),
bitwise M-independence of rows, bitwise dW across layouts (B=N, N x B=1, chunked, padded, permuted),
planted defects that must break those checks, and linear_logp never allocating [R, V].
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any triton kernel module is imported

import pathlib
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels import linear_logp as ll
from gradsweep.triton_kernels import logp as lp
from gradsweep.triton_kernels.lm_head import lm_head

K, N, V = 48, 80, 300
LENGTHS = [37, 5, 64, 1, 23]
EPS32, EPS16 = 2.0 ** -24, 2.0 ** -8  # unit roundoff of fp32 and bf16
MS = (1, 2, 3, 7, 16, 64, 256, 1000)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view({torch.bfloat16: torch.int16, torch.float32: torch.int32}[t.dtype])


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(bits(a), bits(b))


def gen(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).bfloat16()


# Logical data: every value is a function of (sample, position) only.
X_LOG = [gen(100 + s, n, K) for s, n in enumerate(LENGTHS)]
DY_LOG = [gen(200 + s, n, N) for s, n in enumerate(LENGTHS)]
H_LOG = [gen(300 + s, n, K, scale=0.5) for s, n in enumerate(LENGTHS)]
T_LOG = [torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(400 + s))
         for s, n in enumerate(LENGTHS)]
G_LOG = [torch.randn(n, generator=torch.Generator().manual_seed(500 + s)) for s, n in enumerate(LENGTHS)]
W = gen(1, N, K, scale=0.3)
WV = gen(2, V, K, scale=0.3)
MG0 = torch.randn(N, K, generator=torch.Generator().manual_seed(3))  # non-zero main grad: it must be LOADED
MGV0 = torch.randn(V, K, generator=torch.Generator().manual_seed(4))


def pieces(sample: int, lo: int, hi: int) -> list[tuple[int, int]]:
    return [(sample, p) for p in range(lo, hi)]


LAYOUTS: dict[str, list[list[tuple[int, int]]]] = {
    "bn_full": [[(s, p) for s, n in enumerate(LENGTHS) for p in range(n)]],
    "b1_singleton": [pieces(s, 0, n) for s, n in enumerate(LENGTHS)],
    "bn_chunked": [pieces(0, 0, 11), pieces(0, 11, 37) + pieces(1, 0, 2),
                   pieces(1, 2, 5) + pieces(2, 0, 30), pieces(2, 30, 31),
                   pieces(2, 31, 64) + pieces(3, 0, 1) + pieces(4, 0, 9), pieces(4, 9, 23)],
    "bn_padded_right": [[(s, p) if p < n else (-1, 0) for s, n in enumerate(LENGTHS) for p in range(64)]],
    "bn_permuted": [[(s, p) for s in (3, 0, 4, 2, 1) for p in range(LENGTHS[s])]],
    "reverse_calls": [pieces(s, 0, n) for s, n in reversed(list(enumerate(LENGTHS)))],
}


def call_tensors(ids: list[tuple[int, int]], table: list[torch.Tensor], pad_seed: int) -> torch.Tensor:
    """Rows of one call; pad rows are garbage (they must contribute nothing)."""
    pad = gen(pad_seed, *table[0].shape[1:], scale=7.0) if table[0].dim() > 1 else table[0][:1] * 0 - 5
    return torch.stack([table[s][p] if s >= 0 else pad for s, p in ids])


def rows_of(ids: list[tuple[int, int]]) -> RowIdentity:
    return RowIdentity(torch.tensor([s for s, _ in ids], dtype=torch.int64),
                       torch.tensor([p for _, p in ids], dtype=torch.int64))


def logical(calls, outs) -> dict[tuple[int, int], torch.Tensor]:
    return {i: o[j] for ids, o in zip(calls, outs) for j, i in enumerate(ids) if i[0] >= 0}


def run_det_linear(calls):
    fold = CanonicalFold(MG0.clone(), LENGTHS, gemm.TILE)
    w = W.clone().requires_grad_()
    ys, dxs = [], []
    for ids in calls:
        x = call_tensors(ids, X_LOG, 9).requires_grad_()
        y = gemm.det_linear(x, w, rows_of(ids), fold)
        y.backward(call_tensors(ids, DY_LOG, 8))
        ys.append(y.detach())
        dxs.append(x.grad)
    assert w.grad is None  # dW lives in fold.main_grad only
    return logical(calls, ys), logical(calls, dxs), fold.finish()


def run_linear_logp(calls):
    fold = CanonicalFold(MGV0.clone(), LENGTHS, gemm.TILE)
    w = WV.clone().requires_grad_()
    outs, dhs = [], []
    for ids in calls:
        h = call_tensors(ids, H_LOG, 7).requires_grad_()
        t = torch.stack([T_LOG[s][p] if s >= 0 else torch.tensor(-100) for s, p in ids])
        g = torch.stack([G_LOG[s][p] if s >= 0 else torch.tensor(3.0) for s, p in ids])
        out = ll.linear_logp(h, w, t, rows_of(ids), fold)
        out.backward(g)
        outs.append(out.detach())
        dhs.append(h.grad)
    return logical(calls, outs), logical(calls, dhs), fold.finish()


@pytest.fixture(scope="module")
def det_linear_runs():
    return {name: run_det_linear(calls) for name, calls in LAYOUTS.items()}


@pytest.fixture(scope="module")
def linear_logp_runs():
    return {name: run_linear_logp(calls) for name, calls in LAYOUTS.items()}


# ---------------------------------------------------------------- accuracy vs float64

def test_det_linear_accuracy(det_linear_runs):
    ys, dxs, mg = det_linear_runs["bn_full"]
    x = torch.cat(X_LOG).double()
    dy = torch.cat(DY_LOG).double()
    w = W.double()
    y, dx = torch.stack(list(ys.values())).double(), torch.stack(list(dxs.values())).double()
    ref_y, ref_dx, ref_dw = x @ w.T, dy @ w, MG0.double() + dy.T @ x
    # bf16 output: one rounding (EPS16 |ref|) + fp32 accumulation over the reduction (n EPS32 sum |a||b|)
    assert ((y - ref_y).abs() <= EPS16 * ref_y.abs() + K * EPS32 * (x.abs() @ w.abs().T)).all()
    assert ((dx - ref_dx).abs() <= EPS16 * ref_dx.abs() + N * EPS32 * (dy.abs() @ w.abs())).all()
    t = x.shape[0]
    tol_dw = (t + 1) * EPS32 * (MG0.double().abs() + dy.abs().T @ x.abs())
    assert ((mg.double() - ref_dw).abs() <= tol_dw).all()


def test_lm_head_is_det_linear():
    x = torch.cat(H_LOG)
    rows = RowIdentity.packed(LENGTHS)
    y = lm_head(x, WV, rows, None)
    assert y.shape == (x.shape[0], V)
    ref = x.double() @ WV.double().T
    tol = EPS16 * ref.abs() + K * EPS32 * (x.double().abs() @ WV.double().abs().T)
    assert ((y.double() - ref).abs() <= tol).all()


def test_selected_logp_accuracy_and_grad():
    logits = gen(11, 90, V, scale=3.0).requires_grad_()
    t = torch.randint(0, V, (90,), generator=torch.Generator().manual_seed(12))
    t[5] = -100  # ignored target: logp 0, no gradient
    g = torch.randn(90, generator=torch.Generator().manual_seed(13))
    out = lp.selected_logp(logits, t)
    out.backward(g)
    ld = logits.detach().double().requires_grad_()
    ok = t >= 0
    ref = torch.where(ok, torch.log_softmax(ld, 1).gather(1, t.clamp(min=0)[:, None])[:, 0], 0.0)
    ref.backward(g.double())
    # fp32 math: exp/log relative errors of a few EPS32 per term, V terms in the sum
    scale = ld.detach().abs().max(1).values + 1
    assert out.dtype == torch.float32
    assert ((out.double() - ref.detach()).abs() <= (V + 8) * EPS32 * scale).all()
    assert logits.grad.dtype == torch.bfloat16
    d, dref = logits.grad.double(), ld.grad
    tol = EPS16 * dref.abs() + 64 * EPS32 * g.double().abs()[:, None] * scale[:, None]
    assert ((d - dref).abs() <= tol).all()
    assert (logits.grad[5] == 0).all()


def test_linear_logp_accuracy(linear_logp_runs):
    outs, dhs, mg = linear_logp_runs["bn_full"]
    h = torch.cat(H_LOG).double().requires_grad_()
    w = WV.double().requires_grad_()
    t, g = torch.cat(T_LOG), torch.cat(G_LOG).double()
    ref = torch.log_softmax(h @ w.T, 1).gather(1, t[:, None])[:, 0]
    ref.backward(g)
    out = torch.stack(list(outs.values())).double()
    dh = torch.stack(list(dhs.values())).double()
    z = h.detach().abs() @ w.detach().abs().T
    zmax = z.max(1).values + 1
    assert ((out - ref.detach()).abs() <= (V + K + 8) * EPS32 * zmax).all()
    # dlogits are rounded to bf16 before the dhidden / dW GEMMs: EPS16 relative per term
    p = torch.softmax(h.detach() @ w.detach().T, 1)
    dl_abs = g.abs()[:, None] * (p + torch.nn.functional.one_hot(t, V))
    tol_dh = EPS16 * h.grad.abs() + 2 * EPS16 * (dl_abs @ w.detach().abs()) + 1e-6
    assert ((dh - h.grad).abs() <= tol_dh).all()
    ref_dw = MGV0.double() + w.grad
    tol_dw = 2 * EPS16 * (dl_abs.T @ h.detach().abs()) + 200 * EPS32 * (MGV0.double().abs() + 1)
    assert ((mg.double() - ref_dw).abs() <= tol_dw).all()


# ---------------------------------------------------------------- invariance across layouts

@pytest.mark.parametrize("layout", [k for k in LAYOUTS if k != "bn_full"])
def test_det_linear_layouts_bitwise(det_linear_runs, layout):
    ys0, dxs0, mg0 = det_linear_runs["bn_full"]
    ys, dxs, mg = det_linear_runs[layout]
    assert same(mg, mg0), f"dW differs between bn_full and {layout}"
    assert ys.keys() == ys0.keys()
    assert all(same(ys[i], ys0[i]) and same(dxs[i], dxs0[i]) for i in ys0)


@pytest.mark.parametrize("layout", [k for k in LAYOUTS if k != "bn_full"])
def test_linear_logp_layouts_bitwise(linear_logp_runs, layout):
    o0, d0, mg0 = linear_logp_runs["bn_full"]
    o, d, mg = linear_logp_runs[layout]
    assert same(mg, mg0), f"dW differs between bn_full and {layout}"
    assert all(same(o[i], o0[i]) and same(d[i], d0[i]) for i in o0)


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
    """One canonical tile sequence read from contiguous rows, from permuted storage, and with the
    tiles' rows split between two calls' tensors: the same bits (the gather only moves addresses)."""
    t = 4 * gemm.TILE
    x, dy = gen(31, t, K), gen(32, t, N)
    plan = torch.arange(t, dtype=torch.int32).view(-1, gemm.TILE)
    plan[1, 40:] = -1  # a partial tile (a sample's last tile)
    a = gemm.dw_fold_raw(plan, x, dy, MG0.clone())
    perm = torch.randperm(t, generator=torch.Generator().manual_seed(33))
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(t)
    plan_p = torch.where(plan >= 0, inv[plan.clamp(min=0).long()].int(), -1)
    b = gemm.dw_fold_raw(plan_p, x[perm], dy[perm], MG0.clone())
    c = gemm.dw_fold_raw(plan[2:], x, dy, gemm.dw_fold_raw(plan[:2], x, dy, MG0.clone()))
    assert same(a, b) and same(a, c)
    ref = MG0.double() + dy[plan[plan >= 0].long()].double().T @ x[plan[plan >= 0].long()].double()
    assert ((a.double() - ref).abs() <= (t + 1) * EPS32 * (MG0.double().abs() + dy.double().abs().T
                                                          @ x.double().abs())).all()


# ---------------------------------------------------------------- planted defects are caught

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


def test_planted_per_call_dw_is_caught(det_linear_runs):
    """dW summed per call then added to main grad (not folded in canonical tiles): layouts disagree."""
    def per_call(calls):
        mg = MG0.clone()
        for ids in calls:
            real = [i for i in ids if i[0] >= 0]
            x, dy = call_tensors(real, X_LOG, 9), call_tensors(real, DY_LOG, 8)
            mg += gemm.matmul_invariant(dy.t(), x.t(), torch.float32)
        return mg
    full = per_call(LAYOUTS["bn_full"])
    assert same(det_linear_runs["bn_full"][2], det_linear_runs["bn_chunked"][2])
    assert not same(full, per_call(LAYOUTS["bn_chunked"]))


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


def test_no_atomics_in_sources():
    here = pathlib.Path(gemm.__file__).parent
    for name in ("gemm.py", "lm_head.py", "logp.py", "linear_logp.py"):
        assert "atom" + "ic" not in (here / name).read_text().lower(), name


_GPU_SCRIPT = """
import torch
from gradsweep.triton_kernels import gemm, logp as lp, linear_logp as ll
torch.manual_seed(0)
x = torch.randn(4096, 512, device="cuda").bfloat16()
w = (torch.randn(1000, 512, device="cuda") * .05).bfloat16()
t = torch.randint(0, 1000, (4096,), device="cuda")
def bits(a):
    return a.view(torch.int16) if a.dtype == torch.bfloat16 else a.view(torch.int32)
fns = {"fwd": lambda n: gemm.matmul_invariant(x[:n], w),
       "dx": lambda n: gemm.matmul_invariant(x[:n, :500], w[:500].t()),
       "logp": lambda n: lp.logp_forward(x[:n], t[:n])[0],
       "linear_logp": lambda n: ll.fused_forward(x[:n], w, t[:n])[0]}
for name, f in fns.items():
    full = f(4096)
    for m in (1, 2, 3, 7, 16, 64, 256, 1000):
        assert torch.equal(bits(f(m)), bits(full[:m])), (name, m)
print("GPU-OK")
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_m_independence_gpu():
    """The compiled kernels (no interpreter) on the GPU, M up to 4096, in a clean process."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _GPU_SCRIPT], env=env, capture_output=True, text=True,
                         timeout=900, cwd=pathlib.Path(__file__).parents[1])
    assert "GPU-OK" in res.stdout, res.stdout + res.stderr
