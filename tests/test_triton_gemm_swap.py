"""The Triton GEMM's swapped small-M launch (gradsweep/triton_kernels/gemm.py, ``SWAP_M``): out^T = b^T @ a^T through
the same kernel with the strides exchanged. A speed choice that must move no bit: on the GPU its outputs equal the
unswapped launch's (``GRADSWEEP_TRITON_SWAP_M=0`` in a second process) and the TMA kernel's rows at M = 4096, for
the forward (b a transposed weight), dX (b the weight itself) and the accumulating GEMM. On the CPU: the swap is
never taken under the interpreter, and the swapped argument list is the transposed problem, element for element.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.triton_kernels import gemm
from tests.helpers import run_compiled


def test_the_interpreter_never_swaps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under TRITON_INTERPRET the pinned CPU configuration runs (its bits are the CPU suite's golden ones)."""
    called = []
    monkeypatch.setattr(gemm, "_launch_mm_swapped", lambda *a: called.append(a))
    x = torch.randn(3, 32).bfloat16()
    w = torch.randn(16, 32).bfloat16()
    gemm.matmul_invariant(x, w)
    assert not called


def test_the_swapped_arguments_are_the_transposed_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``_launch_mm_swapped`` hands the kernel, read back as (A, B, C, M, N, K, strides): the product it
    describes must be out^T = b^T a^T, for a transposed weight (forward), a plain [K, N] (dX) and an accumulator."""
    seen = []

    def memo(memo_key, key, grid, args, consts, scratch=None, k_even=None):
        seen.append((key, grid, args(), consts, scratch, k_even))

    monkeypatch.setattr(gemm._MM_SWAP, "memo", memo)
    x = torch.randn(5, 48).bfloat16()
    w = torch.randn(40, 48).bfloat16()
    dy = torch.randn(5, 40).bfloat16()
    acc = torch.randn(5, 40)
    cases = [(x, w.t(), torch.randn(5, 40).bfloat16(), False),
             (dy, w, torch.randn(5, 48).bfloat16(), False),
             (x, w.t(), acc.clone(), True)]
    for a, b, out, acc_in in cases:
        gemm._launch_mm_swapped(a, b, out, acc_in)
        key, grid, args, consts, scratch, k_even = seen[-1]
        A, B, C, m2, n2, k2, s_am, s_ak, s_bk, s_bn, s_cm, s_cn = args
        assert (m2, n2, k2) == (b.shape[1], a.shape[0], a.shape[1])
        assert (A.data_ptr(), B.data_ptr(), C.data_ptr()) == (b.data_ptr(), a.data_ptr(), out.data_ptr())
        # rebuild the three operands from base pointer + strides, as the kernel addresses them
        a2 = torch.as_strided(A, (m2, k2), (s_am, s_ak))
        b2 = torch.as_strided(B, (k2, n2), (s_bk, s_bn))
        c2 = torch.as_strided(C, (m2, n2), (s_cm, s_cn))
        assert torch.equal(a2, b.t()) and torch.equal(b2, a.t())
        assert c2.data_ptr() == out.data_ptr() and torch.equal(c2, out.t())
        assert consts == {"ACC_IN": acc_in, "HINT_N": False} and scratch == (2 if acc_in else None) and k_even == k2
        assert key[0] == 16 and grid({"BM": 64, "BN": 16}) == ((b.shape[1] + 63) // 64,)


_GPU_SCRIPT = r"""
import sys
import torch
from gradsweep.triton_kernels import gemm
gen = torch.Generator(device="cuda").manual_seed(3)
out = {}
for n, k in ((4096, 4096), (1032, 1000), (151936, 512)):
    w = torch.randn(n, k, generator=gen, device="cuda").bfloat16()
    x = torch.randn(4096, k, generator=gen, device="cuda").bfloat16()
    dy = torch.randn(4096, n, generator=gen, device="cuda").bfloat16()
    full_y, full_dx = gemm.matmul_invariant(x, w), gemm.matmul_invariant(dy, w.t())
    for m in (1, 2, 15, 16, 17, 33, 64, 65):
        y, dx = gemm.matmul_invariant(x[:m], w), gemm.matmul_invariant(dy[:m], w.t())
        assert torch.equal(y.view(torch.int16), full_y[:m].view(torch.int16)), ("fwd rows", n, k, m)
        assert torch.equal(dx.view(torch.int16), full_dx[:m].view(torch.int16)), ("dX rows", n, k, m)
        acc = torch.zeros(m, n, device="cuda")
        gemm.matmul_accumulate(x[:m], w.t(), acc)
        gemm.matmul_accumulate(x[:m], w.t(), acc)
        out[(n, k, m)] = (y.cpu(), dx.cpu(), acc.cpu())
torch.save(out, sys.argv[1] if len(sys.argv) > 1 else "/dev/null")
assert gemm.SWAP_M == 0 or gemm._MM_SWAP.best, "the swapped launch never ran"
print("GPU-OK", gemm.SWAP_M)
"""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_swapped_small_m_gives_the_unswapped_bits(tmp_path) -> None:
    """The swapped launch's rows equal the same rows of the M = 4096 product (the TMA kernel), and a second process
    with the swap off (GRADSWEEP_TRITON_SWAP_M=0) gives the same bits for every output, the accumulator included."""
    files = {}
    for swap in ("64", "0"):
        files[swap] = tmp_path / f"swap{swap}.pt"
        script = _GPU_SCRIPT.replace('sys.argv[1] if len(sys.argv) > 1 else "/dev/null"', repr(str(files[swap])))
        res = run_compiled(script, timeout=600, env={"GRADSWEEP_TRITON_SWAP_M": swap})
        assert f"GPU-OK {swap}" in res.stdout, res.stdout + res.stderr
    on, off = torch.load(files["64"]), torch.load(files["0"])

    def bits(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32)

    bad = [key for key in on for i in range(3) if not torch.equal(bits(on[key][i]), bits(off[key][i]))]
    assert not bad, f"swapped and unswapped launches differ in bits: {bad}"


def test_which_launches_swap() -> None:
    """The measured rule (``SWAP_M`` 32, a long reduction swaps only at M <= 8): the M = 64 launch and a 16-row dX
    through a vocabulary-wide weight stay unswapped, a 1-row one swaps."""
    if gemm.SWAP_M != 32:
        pytest.skip("GRADSWEEP_TRITON_SWAP_M set in the environment")
    assert gemm.swaps(1, 4096) and gemm.swaps(16, 4096) and gemm.swaps(32, 8192)
    assert not gemm.swaps(33, 4096) and not gemm.swaps(64, 4096)
    assert gemm.swaps(1, 151936) and gemm.swaps(8, 14336)
    assert not gemm.swaps(9, 14336) and not gemm.swaps(16, 151936)


def test_one_row_tunes_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """M = 1 (a constant in Triton's specialisation: its own binary) has its own tuning bucket and candidates, so a
    decode step's best pipeline is chosen on M = 1 itself and never inherited from an M = 16 launch (or vice versa)."""
    keys = []
    monkeypatch.setattr(gemm._MM_SWAP, "memo", lambda memo_key, key, *rest, **kw: keys.append(key))
    w = torch.randn(40, 48).bfloat16()
    for m in (1, 2, 16, 17):
        gemm._launch_mm_swapped(torch.randn(m, 48).bfloat16(), w.t(), torch.empty(m, 40).bfloat16(), False)
    assert [k[0] for k in keys] == [1, 16, 16, 64]
    assert [gemm.swap_bucket(m) for m in (1, 2, 16, 17, 32)] == [1, 16, 16, 64, 64]
    one, sixteen = gemm.swap_configs((1,)), gemm.swap_configs((16,))
    assert one and {str(c) for c in one} != {str(c) for c in sixteen}
    # a speed choice only: every candidate keeps one K chain (BK blocks in order), none splits K
    assert all(c.kwargs["BN"] == 16 and c.kwargs["BM"] in (64, 128) for c in one)
