"""Verdicts that do not depend on the host CPU: no Triton kernel's bits may follow the host BLAS.

Under TRITON_INTERPRET=1 a raw ``tl.dot`` is ``numpy.matmul``, i.e. OpenBLAS, whose kernel is picked by the CPU;
on some CPUs (AMD EPYC, or ``OPENBLAS_CORETYPE=Haswell``) a row's bits then depend on its position in the block.
Here ``numpy.matmul`` is replaced by a deliberately position-dependent one (never by pinning a BLAS kernel):
a planted kernel with a raw ``tl.dot`` must go red under it, and every kernel that multiplies matrices must keep
its bitwise layout verdicts (and never call the host matmul at all: they use ``_common.mma``).
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from gradsweep.harness.kernel_check import check_kernel
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels._common import mma, same_bits

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp of masked lanes

_REAL_MATMUL = np.matmul


class PositionDependentMatmul:
    """A host 'BLAS' whose result follows the row's position in the block, as OpenBLAS's Haswell / Zen kernels
    do: row r sums K forwards, backwards, or even-then-odd indices for r % 3 = 0, 1, 2, and rows of class 2 are
    also off by 2^-14 relative (far inside any accuracy bound) so that the position shows even through a bf16
    output rounding. Counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, a, b, *args, dtype=None, **kwargs):
        self.calls += 1
        a, b = np.asarray(a), np.asarray(b)
        if a.ndim != 2 or b.ndim != 2 or args or kwargs:
            return _REAL_MATMUL(a, b, *args, dtype=dtype, **kwargs)
        out_t = np.dtype(dtype) if dtype is not None else np.result_type(a, b)
        k = a.shape[1]
        orders = (range(k), range(k - 1, -1, -1), [*range(0, k, 2), *range(1, k, 2)])
        out = np.zeros((a.shape[0], b.shape[1]), dtype=out_t)
        for cls, order in enumerate(orders):
            rows = slice(cls, None, 3)
            for j in order:
                out[rows] += a[rows, j:j + 1].astype(out_t) * b[j][None, :].astype(out_t)
        out[2::3] *= out_t.type(1 + 2.0 ** -14)
        return out


@pytest.fixture
def fake_blas(monkeypatch) -> PositionDependentMatmul:
    fake = PositionDependentMatmul()
    monkeypatch.setattr(np, "matmul", fake)  # the interpreter looks np.matmul up at every tl.dot
    return fake


def _gen(seed: int, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(torch.bfloat16)


# ------------------------------------------------------------------------------- the fake bites a raw tl.dot
@triton.jit
def _block_product_kernel(A, B, C, K: tl.constexpr, N: tl.constexpr, BM: tl.constexpr, RAW: tl.constexpr):
    """C = A @ B for one [BM, K] block: RAW uses tl.dot (PLANTED: host BLAS), else _common.mma."""
    r = tl.arange(0, BM)
    k = tl.arange(0, K)
    n = tl.arange(0, N)
    a = tl.load(A + r[:, None] * K + k[None, :]).to(tl.float32)
    b = tl.load(B + k[:, None] * N + n[None, :]).to(tl.float32)
    if RAW:
        c = tl.dot(a, b)
    else:
        c = mma(a, b, None)
    tl.store(C + r[:, None] * N + n[None, :], c)


def _rows_follow_position(raw: bool) -> bool:
    """Do a row's bits change when the same rows sit one position lower in the block?"""
    bm, k, n = 16, 64, 16
    x, w = _gen(1, bm, k), _gen(2, k, n)
    shifted = torch.roll(x, 1, dims=0)
    out, out_shifted = torch.empty(bm, n), torch.empty(bm, n)
    _block_product_kernel[(1,)](x, w, out, K=k, N=n, BM=bm, RAW=raw)
    _block_product_kernel[(1,)](shifted, w, out_shifted, K=k, N=n, BM=bm, RAW=raw)
    return not same_bits(out[:-1], out_shifted[1:])


def test_fake_blas_makes_a_raw_dot_position_dependent(fake_blas):
    assert _rows_follow_position(raw=True)  # PLANTED: raw tl.dot under this host BLAS is red
    assert fake_blas.calls > 0


def test_mma_ignores_the_host_blas(fake_blas):
    assert not _rows_follow_position(raw=False)
    assert fake_blas.calls == 0


def test_no_raw_dot_in_kernel_sources():
    """Every product in the kernels goes through _common.mma (whose GPU branch is the one tl.dot)."""
    offenders = []
    for path in sorted(pathlib.Path(gemm.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        allowed = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == "mma"
                   and path.name == "_common.py" for n in ast.walk(f)}
        offenders += [f"{path.name}:{n.lineno}" for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and n.attr == "dot" and isinstance(n.value, ast.Name)
                      and n.value.id == "tl" and id(n) not in allowed]
    assert not offenders, f"raw tl.dot outside _common.mma: {offenders}"


# ------------------------------------------------------------------- kernels keep their verdicts under it
# Layouts that put a sample's rows at other positions of a block: left padding shifts every row (GEMM rows);
# chunked prefill starts a block at a chunk boundary (attention's query blocks follow the chunk).
# (Attention on fewer tokens: its interpreter run is the slow one.)
CHECKS = [("det_gemm", "bn_padded_left", None), ("linear_logp", "bn_padded_left", None),
          ("attention", "bn_chunked", [37, 5, 23])]


@pytest.mark.parametrize(("op", "layout", "lengths"), CHECKS)
def test_verdicts_hold_under_a_position_dependent_blas(fake_blas, op, layout, lengths):
    report = check_kernel(op, f"triton.{op}", layouts=[layout], lengths=lengths)
    assert report.ok, report.first_failure
    assert fake_blas.calls == 0, f"{op}: {fake_blas.calls} products went to the host BLAS"


@triton.jit
def _raw_dot(a, b, acc):
    """PLANTED: what every product was before _common.mma (an upcast tl.dot, i.e. the host BLAS)."""
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)


def test_planted_raw_dot_kernel_is_red_under_a_position_dependent_blas(fake_blas, monkeypatch):
    monkeypatch.setattr(gemm, "mma", _raw_dot)  # the interpreter resolves a kernel's globals at each call
    report = check_kernel("det_gemm", "triton.det_gemm", layouts=["bn_padded_left"])
    assert not report.ok and fake_blas.calls > 0
    assert "forward_invariance" in report.first_failure and "differ in bits" in report.first_failure


def test_row_bits_do_not_follow_batch_position_under_a_position_dependent_blas(fake_blas):
    """Each row alone, in a batch, and shifted by one row: the same bits (forward GEMM and dX)."""
    x, dy, w = _gen(10, 101, 48), _gen(11, 100, 40), _gen(12, 40, 48, scale=0.3)
    full = gemm.matmul_invariant(x[1:], w)
    shifted = gemm.matmul_invariant(x, w)[1:]
    alone = torch.cat([gemm.matmul_invariant(x[i:i + 1], w) for i in (2, 3, 51)])
    assert same_bits(full, shifted) and same_bits(full[[1, 2, 50]], alone)
    dx = gemm.matmul_invariant(dy, w.t())
    assert same_bits(dx[1:], gemm.matmul_invariant(dy[1:], w.t()))
    assert fake_blas.calls == 0
