"""scripts/backward_thread_probe.py's instrumentation on the CPU: a Python backward's span is found inside the
``backward`` call that ran it, its parts add up, a stock step has no body, and the profile names the body's
functions. (On a CPU the engine runs every backward on the calling thread; the device thread is the GPU box's.)"""

from __future__ import annotations

import time

import torch

from scripts.backward_thread_probe import Trace, fmt, measure, profile_text, split, traced


def _busy_backward_marker(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _Slow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x * 2

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        _busy_backward_marker(2e-4)
        return dy * 2


def test_a_python_backward_is_split_into_hand_off_body_and_return():
    x = torch.randn(8, requires_grad=True)

    def step() -> None:
        torch.autograd.backward([_Slow.apply(x).sum()])

    host, s, trace = measure(step, 20, worker=True, profile=True, sync=lambda: None)
    assert len(trace.calls) == 20 and len(trace.bodies) == 20
    assert s.on_caller is True  # a CPU backward runs on the calling thread
    assert s.body is not None and s.body >= 200.0  # the 0.2 ms busy loop is inside the body
    assert s.hand_in is not None and s.hand_out is not None and s.hand_in >= 0 and s.hand_out >= 0
    assert abs(s.hand_in + s.body + s.hand_out - s.total) < 0.5 * s.total  # medians of parts: roughly the whole
    assert host >= s.total * 0.5
    assert "_busy_backward_marker" in profile_text(trace, 10)
    assert "bodies on the caller" in fmt(s)


def test_a_stock_step_has_no_body_and_the_wrappers_are_removed():
    x = torch.randn(8, requires_grad=True)
    before = (torch.autograd.backward, torch.autograd.function.BackwardCFunction.apply)
    trace = Trace()
    with traced(trace):
        torch.autograd.backward([(x * 3).sum()])
    assert (torch.autograd.backward, torch.autograd.function.BackwardCFunction.apply) == before
    s = split(trace, 0)
    assert len(trace.calls) == 1 and not trace.bodies
    assert s.body is None and s.on_caller is None and s.total > 0
    assert "no Python backward" in fmt(s)
