"""Kernels that compute the right values but write memory they do not own are red (``SideEffect``).

Invariance and accuracy read only what each call returns, so each defect planted here is green without the
harness's side-effect guard: the tampering happens after the values it would change were read (an input
overwritten by its own gradient once its backward ran, an upstream gradient zeroed after it was consumed, a
weight nudged once no backward reads it again, a forward output that lives in a workspace the next call reuses).
A trainer reads that memory afterwards. Every prediction is exact: the set of red layouts and the named memory.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.harness import execute
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.layouts import build_calls
from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest
from gradsweep.ops.base import CallContext, CallOutput, Candidate
from gradsweep.results import Status
from tests.helpers import planted_candidate

OP, IMPL = "rms_norm", "triton.rms_norm"
LAYOUTS = ["bn_full", "bn_chunked", "b1_singleton"]


def _wrapped(tamper) -> Candidate:
    """The real Triton rms_norm with ``tamper(ctx, out)`` applied to every call (``out``: its CallOutput)."""
    def run(real: Candidate, ctx: CallContext) -> CallOutput:
        out = real.run(ctx)
        return tamper(ctx, out) or out

    return planted_candidate(OP, IMPL, run)


def _input_holds_its_gradient(ctx: CallContext, out: CallOutput) -> None:
    """dx written into x's own memory once the backward produced it (a memory-saving in-place backward)."""
    x = ctx.inputs["x"]

    def hook(grad: torch.Tensor) -> torch.Tensor:
        x.data.copy_(grad.to(x.dtype))
        return grad

    x.register_hook(hook)


class _ConsumesUpstream(torch.autograd.Function):
    """Identity whose backward hands on a copy of its upstream gradient and zeroes the original."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        out = grad.clone()
        grad.zero_()
        return out


def _upstream_zeroed(ctx: CallContext, out: CallOutput) -> CallOutput:
    return CallOutput({"y": _ConsumesUpstream.apply(out.tensors["y"])}, out.rows)


def _weight_nudged_after_backward(ctx: CallContext, out: CallOutput) -> None:
    """The weight moved by 2^-7 of itself once the call's backward ran (an optimizer step leaking into a kernel;
    on a one-call layout nothing reads the weight afterwards)."""
    w = ctx.params["weight"]
    ctx.inputs["x"].register_hook(lambda g: (w.data.mul_(1.0 - 2.0 ** -7), g)[1])


_WORKSPACE: dict[str, torch.Tensor] = {}


def _shared_workspace(ctx: CallContext, out: CallOutput) -> None:
    """Every call's output returned in one workspace, reused (overwritten) by the next call."""
    y = out.tensors["y"]
    ws = _WORKSPACE.get("y")
    if ws is None or ws.shape[0] < y.shape[0] or ws.shape[1:] != y.shape[1:] or ws.dtype != y.dtype:
        ws = _WORKSPACE["y"] = torch.empty((max(y.shape[0], 4096), *y.shape[1:]), dtype=y.dtype)
    ws[: y.shape[0]].copy_(y.detach())
    y.data = ws[: y.shape[0]]


@pytest.fixture
def guard_off(monkeypatch):
    """The control: the same defects with the side-effect guard disabled (they must then be green)."""
    monkeypatch.setattr(execute._Guard, "check_outputs", lambda *a: None)
    monkeypatch.setattr(execute._Guard, "check_handed", lambda *a: None)


def _multi_call_layouts() -> set[str]:
    m = load_manifest(DEFAULT_MANIFEST)
    return {lay for lay in LAYOUTS if len(build_calls(lay, m.layouts.get(lay), m.samples.lengths, m.seed)) > 1}


def _reds(report) -> dict[str, str]:
    return {lay: v.first_failure or "" for lay, v in report.cells.items() if v.status != Status.GREEN}


def test_the_honest_kernel_is_green_on_these_layouts():
    report = check_kernel(OP, IMPL, layouts=LAYOUTS)
    assert report.ok, report.first_failure


WRITERS = [
    pytest.param(_input_holds_its_gradient, LAYOUTS, "call 1 of 1: input x was written", id="input"),
    pytest.param(_upstream_zeroed, LAYOUTS, "call 1 of 1: upstream gradient of y was written", id="upstream"),
    pytest.param(_weight_nudged_after_backward, ["bn_full"], "parameter weight was written", id="weight"),
]


@pytest.mark.parametrize("tamper, layouts, named", WRITERS)
def test_a_kernel_writing_what_it_was_handed_is_red_naming_it(tamper, layouts, named):
    report = check_kernel(OP, _wrapped(tamper), layouts=layouts)
    reds = _reds(report)
    assert set(reds) == set(layouts), reds
    for lay, failure in reds.items():
        assert report.cells[lay].status == Status.RED_VERDICT
        assert "side effect" in failure, (lay, failure)
    assert named in reds["bn_full"]


@pytest.mark.parametrize("tamper, layouts, named", WRITERS)
def test_without_the_guard_the_same_writers_pass_as_green(guard_off, tamper, layouts, named):
    assert check_kernel(OP, _wrapped(tamper), layouts=layouts).ok


def test_outputs_in_a_workspace_the_next_call_reuses_are_red_on_multi_call_layouts_only():
    _WORKSPACE.clear()
    multi = _multi_call_layouts()
    assert multi and multi != set(LAYOUTS)  # the prediction separates something
    report = check_kernel(OP, _wrapped(_shared_workspace), layouts=LAYOUTS)
    reds = _reds(report)
    assert set(reds) == multi, reds
    for failure in reds.values():
        assert "side effect" in failure and "output y changed after the call returned it" in failure


def test_without_the_guard_the_shared_workspace_passes_as_green(guard_off):
    _WORKSPACE.clear()
    assert check_kernel(OP, _wrapped(_shared_workspace), layouts=LAYOUTS).ok
