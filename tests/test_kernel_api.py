"""``kernel_api.run_function``: a call that records no graph runs the Function's forward alone (the same launches,
no ``apply``); a call that must record one goes through ``apply`` and gets its backward."""

from __future__ import annotations

import pytest
import torch

from gradsweep.kernel_api import records_graph, run_function


class _Doubled(torch.autograd.Function):
    applied = 0

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return x * (2.0 * scale)

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (2.0 * ctx.scale) + 0.0 * x, None


@pytest.fixture
def counted(monkeypatch):
    real = _Doubled.apply

    def apply(*args):
        _Doubled.applied += 1
        return real(*args)

    _Doubled.applied = 0
    monkeypatch.setattr(_Doubled, "apply", apply)
    return _Doubled


def test_no_graph_skips_apply_with_the_same_values(counted):
    x = torch.arange(4.0)
    with torch.no_grad():
        y = run_function(counted, x.clone().requires_grad_(), 3.0)  # grad mode off: nothing to record
    assert counted.applied == 0 and y.grad_fn is None and torch.equal(y, x * 6.0)
    z = run_function(counted, x, 3.0)  # grad mode on, no input requires grad
    assert counted.applied == 0 and z.grad_fn is None and torch.equal(z, x * 6.0)


def test_a_graph_goes_through_apply_and_backpropagates(counted):
    x = torch.arange(4.0, requires_grad=True)
    y = run_function(counted, x, 0.5)
    assert counted.applied == 1 and y.grad_fn is not None
    y.sum().backward()
    assert torch.equal(x.grad, torch.ones(4))


def test_records_graph_needs_grad_mode_and_a_tensor_requiring_grad():
    a, b = torch.zeros(1), torch.zeros(1, requires_grad=True)
    assert records_graph(a, b) and not records_graph(a)
    assert records_graph(1.0, None, b) and not records_graph(a, 3, None)  # other arguments are ignored
    with torch.no_grad():
        assert not records_graph(a, b)
