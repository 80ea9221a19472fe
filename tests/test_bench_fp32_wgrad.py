"""The bench's ``fp32_wgrad`` baseline (the fair ceiling of a fold into an FP32 main grad) on the CPU: its backward
adds dY^T X into its own FP32 main grad once per step (never the families' main grads), computes dX only when the
case asks for it, and is declared by the dW cases beside the stock path."""

from __future__ import annotations

import pytest
import torch

from gradsweep.bench.baselines import BASELINES, _Fp32Wgrad
from gradsweep.bench.cases import STOCK, Case
from gradsweep.bench.catalog.gemm import cases
from gradsweep.bench.data import draw
from gradsweep.ops.registry import get_op


def test_backward_adds_dy_t_x_into_the_main_grad_and_returns_dx_only_when_asked(monkeypatch) -> None:
    """Small integers: every product and sum is exact in FP32, so the float64 references are the exact values
    (equality, no tolerance)."""
    gen = torch.Generator().manual_seed(3)

    def ints(*shape: int) -> torch.Tensor:
        return torch.randint(-4, 5, shape, generator=gen).float()

    x, w, dy, start = ints(9, 5), ints(7, 5), ints(9, 7), ints(7, 5)
    exact_y = torch.einsum("tk,nk->tn", x.double(), w.double()).float()
    exact_g = (start.double() + torch.einsum("tn,tk->nk", dy.double(), x.double())).float()
    exact_dx = torch.einsum("tn,nk->tk", dy.double(), w.double()).float()

    g = start.clone()
    xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = _Fp32Wgrad.apply(xl, wl, g)
    assert torch.equal(y, exact_y)
    y.backward(dy)
    assert torch.equal(g, exact_g) and torch.equal(xl.grad, exact_dx)
    assert wl.grad is None  # dW lives in the main grad only

    g2 = start.clone()
    frozen = x.clone()  # a dW-only case: no dX GEMM runs, the main grad gets the same sum
    y2 = _Fp32Wgrad.apply(frozen, w.clone().requires_grad_(True), g2)
    mm_calls = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a, **k: mm_calls.append(a) or real_mm(*a, **k))
    y2.backward(dy)
    assert mm_calls == [], "the dW-only backward computed dX"
    assert torch.equal(g2, exact_g)


def test_the_dw_cases_declare_it_and_a_step_leaves_the_families_main_grads_alone() -> None:
    quick = {c.name: c for c in cases(True)}
    full = {c.name: c for c in cases(False)}
    for table in (quick, full):
        assert table["dw_t4096"].baselines == (STOCK, "fp32_wgrad")
        assert all("fp32_wgrad" not in c.baselines for n, c in table.items() if not n.startswith("dw_"))
    case = quick["dw_t4096"]
    data = draw(get_op("det_gemm"), case.shape, case.tokens, torch.device("cpu"), 0)
    before = data.main_grads["W"].clone()
    for mode in ("fwd", "fwd_train", "fwd_bwd"):
        BASELINES["fp32_wgrad"](case, data, mode)()
    assert torch.equal(data.main_grads["W"], before)


def test_it_refuses_what_is_not_a_linear_layer() -> None:
    case = Case("rms_norm", "bwd", "bwd", {"hidden": 8}, (4,), "bwd")
    data = draw(get_op("rms_norm"), case.shape, case.tokens, torch.device("cpu"), 0)
    with pytest.raises(ValueError, match="fp32_wgrad baseline needs a linear layer"):
        BASELINES["fp32_wgrad"](case, data, "fwd_bwd")
