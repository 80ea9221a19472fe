"""``bn_strided``: the reference layout's calls in other memory must give the same bits.

A trainer or an inference engine hands kernels slices (q and k of a fused QKV projection, a shifted label column,
a batch buffer's rows): the row stride is larger than the row and the view starts past the buffer's start; and a
distributed optimizer keeps parameters and main grads as views into flat buffers (a nonzero storage offset).
Every other layout hands fresh contiguous tensors, so a kernel that indexes ``row * width`` from ``data_ptr`` of
the storage, or ignores a storage offset, was green everywhere. Planted here in a real Triton kernel's adapter,
each such defect is red on exactly ``bn_strided``; the honest kernel is green there.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.harness.execute import run_layout
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.layouts import LAYOUT_NAMES, STRIDE_GAP, build_calls, offset_copy, same_physical_calls, strided_copy
from gradsweep.ops.base import CallContext, CallOutput, Candidate
from gradsweep.ops.registry import get_op
from gradsweep.results import Status
from gradsweep.workload import Workload
from tests.helpers import planted_candidate

OP, IMPL = "rms_norm", "triton.rms_norm"
LAYOUTS = ["bn_full", "bn_chunked", "bn_padded_left", "bn_strided"]


def test_strided_copy_keeps_values_in_other_memory():
    x = torch.arange(24, dtype=torch.float32).reshape(4, 2, 3).to(torch.bfloat16)
    v = strided_copy(x)
    assert torch.equal(v, x) and not v.is_contiguous()
    assert v.stride() == (6 + 2 * STRIDE_GAP, 3, 1) and v.storage_offset() == STRIDE_GAP
    buf = torch.as_strided(v, (4, 6 + 2 * STRIDE_GAP), (6 + 2 * STRIDE_GAP, 1), 0)
    assert torch.isnan(buf[:, :STRIDE_GAP].float()).all() and torch.isnan(buf[:, -STRIDE_GAP:].float()).all()
    ids = strided_copy(torch.arange(5))
    assert torch.equal(ids, torch.arange(5)) and ids.stride() == (1 + 2 * STRIDE_GAP,)
    assert int(torch.as_strided(ids, (1,), (1,), 0)) == -1  # an integer gap is never a valid index


def test_offset_copy_is_contiguous_at_an_offset():
    w = torch.randn(3, 5)
    v = offset_copy(w)
    assert torch.equal(v, w) and v.is_contiguous() and v.storage_offset() == STRIDE_GAP
    assert torch.isnan(torch.as_strided(v, (STRIDE_GAP,), (1,), 0)).all()


def test_bn_strided_is_the_reference_calls_in_other_memory():
    lengths = [5, 3]
    full, strided = build_calls("bn_full", None, lengths, 1), build_calls("bn_strided", None, lengths, 1)
    assert len(strided) == 1 and strided[0].strided and not full[0].strided
    assert torch.equal(full[0].rows.sample, strided[0].rows.sample)
    assert not same_physical_calls(full, strided)  # so its cell is not refused as a tautology
    assert "bn_strided" in LAYOUT_NAMES


def test_the_operator_receives_strided_inputs_and_upstream_gradients():
    seen: dict[str, torch.Tensor] = {}

    class _Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen["x"] = x
            return x * 1.0

        @staticmethod
        def backward(ctx, g):
            seen["g"] = g
            return g * 1.0

    op = get_op("silu")
    cand = Candidate("torch.probe", "torch", lambda ctx: CallOutput({"y": _Probe.apply(ctx.inputs["x"])}))
    calls = build_calls("bn_strided", None, [7, 2], 3)
    run_layout(op, cand, {"features": 16}, Workload(3, (7, 2), 0.8), calls, torch.device("cpu"))
    x, g = seen["x"], seen["g"]
    assert not x.is_contiguous() and x.stride(0) == 16 + 2 * STRIDE_GAP and x.storage_offset() == STRIDE_GAP
    assert g.shape == x.shape and not g.is_contiguous()


def test_parameters_and_main_grads_sit_at_an_offset_on_bn_strided_only():
    seen = {}
    def run(real: Candidate, ctx: CallContext) -> CallOutput:
        # the first run of each kind: bn_full's reference run (fresh memory; its last rerun sits in an Arena)
        seen.setdefault(ctx.call.strided, (ctx.params["weight"], ctx.fold("weight").main_grad))
        return real.run(ctx)

    spy = planted_candidate(OP, IMPL, run, name="triton.spy")
    assert check_kernel(OP, spy, layouts=["bn_full", "bn_strided"]).ok
    for t in seen[True]:
        assert t.is_contiguous() and t.storage_offset() == STRIDE_GAP
    assert [t.storage_offset() for t in seen[False]] == [0, 0]


def _wrapped(reinterpret, name: str = "x") -> Candidate:
    """The real Triton rms_norm fed ``reinterpret(t)`` for its input (or parameter) ``name``: the memory a
    defective kernel would read there."""
    def run(real: Candidate, ctx: CallContext) -> CallOutput:
        inputs, params = dict(ctx.inputs), dict(ctx.params)
        where = inputs if name in inputs else params
        where[name] = reinterpret(where[name])
        return real.run(CallContext(ctx.call, inputs, params, ctx.folds, ctx.state, ctx.shape, ctx.lengths))

    return planted_candidate(OP, IMPL, run)


def _rows_assumed_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Rows read at ``offset + row * width`` (the row stride ignored)."""
    return torch.as_strided(x, x.shape, (x.shape[1], 1), x.storage_offset())


def _offset_ignored(x: torch.Tensor) -> torch.Tensor:
    """Rows read from the storage's start (the view's offset ignored)."""
    return torch.as_strided(x, x.shape, x.stride(), 0)


def test_the_honest_kernel_is_green_on_bn_strided():
    report = check_kernel(OP, IMPL, layouts=LAYOUTS)
    assert report.ok, report.first_failure


@pytest.mark.parametrize("reinterpret, name", [(_rows_assumed_contiguous, "x"), (_offset_ignored, "x"),
                                               (_offset_ignored, "weight")])
def test_a_kernel_ignoring_the_strides_is_red_on_bn_strided_only(reinterpret, name):
    report = check_kernel(OP, _wrapped(reinterpret, name), layouts=LAYOUTS)
    reds = {lay for lay, s in report.statuses().items() if s != Status.GREEN}
    # bn_full's last rerun runs in an Arena, whose buffers are views at an offset too: a kernel ignoring the
    # offset is red there as well (the harness's other probe of the same defect)
    assert reds == ({"bn_strided", "bn_full"} if reinterpret is _offset_ignored else {"bn_strided"}), \
        report.first_failure
    assert "bn_strided vs bn_full" in report.cells["bn_strided"].first_failure
    if reinterpret is _offset_ignored:
        assert "in the buffers of a run on other values" in report.cells["bn_full"].first_failure
