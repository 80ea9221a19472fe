"""Harness II: defects that a polite harness calls green must be red (issue 8).

Each planted defect here passed as green before the harness fed hostile boundaries: NaN / inf pads
with NaN upstream gradients, main grads that start nonzero, FP32-class accuracy bounds, the backward
order of a real model, an unfolded parameter. Every prediction is exact: the set of red layouts.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.harness.judge import TautologicalCell, check_not_tautological
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.layouts import LAYOUT_NAMES, build_calls, schedules_for
from gradsweep.ops.base import CallContext, Candidate
from gradsweep.ops.registry import get_op
from gradsweep.results import Status
from tests import planted_ops
from tests.helpers import LENGTHS, planted_candidate


def _reds(report) -> set[str]:
    return {lay for lay, s in report.statuses().items() if s != Status.GREEN}


def _scale(variant: str):
    return check_kernel("planted_scale", f"torch.scale_{variant}", lengths=LENGTHS)


def test_honest_canonical_fold_is_green_everywhere():
    report = _scale("honest")
    assert report.ok, report.first_failure
    assert set(report.cells) == set(LAYOUT_NAMES)


def test_reduction_that_forgets_to_skip_pads_is_red_on_padded_layouts_only():
    report = _scale("folds_pads")
    assert _reds(report) == {"bn_padded_right", "bn_padded_left"}
    assert "dw gradient_invariance" in report.cells["bn_padded_right"].first_failure


def test_kernel_ignoring_the_main_grad_it_is_handed_is_red_everywhere():
    report = _scale("ignore_start")
    assert _reds(report) == set(LAYOUT_NAMES)
    assert all("dw gradient_accuracy" in v.first_failure for v in report.cells.values())


def test_parameter_whose_fold_never_completes_is_red_no_backward_naming_it():
    report = _scale("never_folds")
    assert {v.status for v in report.cells.values()} == {Status.RED_NO_BACKWARD}
    assert all(v.first_failure.startswith("dw:") for v in report.cells.values())
    assert "fold of parameter w never completed" in report.cells["bn_full"].reason


def test_accuracy_baseline_is_the_stock_path_not_the_first_candidate():
    op = get_op("planted_scale")
    assert next(iter(op.candidates)) == "torch.scale_scaled_output"  # the defective one comes first
    report = _scale("scaled_output")
    assert _reds(report) == set(LAYOUT_NAMES)
    assert all("y forward_accuracy" in v.first_failure for v in report.cells.values())


def test_backward_reading_the_last_forward_is_red_once_forwards_run_first():
    # The defect reads the last forward's activations when their shape matches its own: under
    # all-forwards-then-reverse-backwards, exactly the layouts where an earlier call has as many rows as
    # the last one (the interleaved order, F0 B0 F1 B1, would hide it everywhere).
    from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest

    seed = load_manifest(DEFAULT_MANIFEST).seed  # check_kernel's seed for these (non-default) lengths
    report = _scale("stateful")
    predicted = set()
    for lay in LAYOUT_NAMES:
        sizes = [c.num_rows for c in build_calls(lay, None, LENGTHS, seed)]
        if sizes[-1] in sizes[:-1]:
            predicted.add(lay)
    assert predicted and _reds(report) == predicted


def test_multi_call_layouts_run_forwards_first_then_backwards_in_reverse_and_interleaved():
    events: list[tuple[str, int]] = []

    class _Spy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, call):
            ctx.call = call
            events.append(("F", call))
            return x.float() * 1.0

        @staticmethod
        def backward(ctx, g):
            events.append(("B", ctx.call))
            return g.to(torch.bfloat16), None

    counter = {"n": 0}

    def run(ctx: CallContext):
        from gradsweep.ops.base import CallOutput

        counter["n"] += 1
        return CallOutput({"y": planted_ops._Scale.apply(_Spy.apply(ctx.inputs["x"], counter["n"]),
                                                         ctx.params["w"], ctx.rows, ctx.fold("w"), "honest")})

    spy = Candidate("torch.spy", "torch", run, param_grads="fold", fold_tiles=lambda: {"w": planted_ops.SCALE_TILE})
    report = check_kernel("planted_scale", spy, lengths=LENGTHS, layouts=["b1_singleton"])
    assert report.ok, report.first_failure
    n = len(LENGTHS)
    assert schedules_for("b1_singleton", n) == ("reverse", "interleaved")
    # bn_full (reference) once, then b1_singleton reverse, then b1_singleton interleaved
    ref, rest = events[:2], events[2:]
    assert ref == [("F", 1), ("B", 1)]
    reverse, interleaved = rest[:2 * n], rest[2 * n:]
    assert reverse == [("F", 2 + i) for i in range(n)] + [("B", 1 + n - i) for i in range(n)]
    assert interleaved == [e for i in range(n) for e in (("F", 2 + n + i), ("B", 2 + n + i))]


def test_a_layout_identical_to_the_reference_is_refused_as_a_tautology():
    op = get_op("pack")
    lengths = [5, 3]
    full = build_calls("bn_full", None, lengths, 0)
    right = build_calls("bn_padded_right", None, lengths, 0)
    with pytest.raises(TautologicalCell):
        check_not_tautological(op, "bn_padded_right", right, full)  # pack pads every call: identical
    check_not_tautological(op, "bn_padded_left", build_calls("bn_padded_left", None, lengths, 0), full)
    assert "bn_padded_right" not in op.layouts


def test_every_declared_layout_of_every_op_differs_physically_from_the_reference():
    from gradsweep.manifest import DEFAULT_MANIFEST, load_manifest

    m = load_manifest(DEFAULT_MANIFEST)
    ref = build_calls("bn_full", m.layouts.get("bn_full"), m.samples.lengths, m.seed)
    for name in m.ops:
        op = get_op(name)
        for lay in m.layouts_for(name):
            if lay != "bn_full":
                check_not_tautological(op, lay, build_calls(lay, m.layouts.get(lay), m.samples.lengths, m.seed), ref)


# ------------------------------------------------------------------ FP32-class defects in real Triton kernels

def _wrapped(op: str, impl: str, tamper) -> Candidate:
    """A real kernel candidate whose folds are tampered with: ``tamper(fold, outputs)`` on every call."""
    def run(real: Candidate, ctx: CallContext):
        out = real.run(ctx)
        for fold in ctx.folds.values():
            tamper(fold, list(out.tensors.values()))
        return out

    return planted_candidate(op, impl, run)


def _round_accumulator_to_bf16(fold, outputs) -> None:
    """The FP32 main grad kept in bf16: rounded just before each call's backward folds into it."""
    def round_it(grad):
        fold.main_grad.copy_(fold.main_grad.to(torch.bfloat16).float())
        return grad

    for t in outputs:
        t.register_hook(round_it)


def _scale_increment(fold, outputs) -> None:
    """This step's contribution to the main grad scaled by 1 + 2^-8 when the harness reads it."""
    if getattr(fold, "_tampered", False):
        return
    fold._tampered = True
    start, finish = fold.main_grad.clone(), fold.finish

    def scaled_finish():
        mg = finish()
        mg.copy_(start + (mg - start) * (1.0 + 2.0 ** -8))
        return mg

    fold.finish = scaled_finish


@pytest.mark.parametrize("op, impl, tamper, tensor", [
    ("rms_norm", "triton.rms_norm", _round_accumulator_to_bf16, "dweight"),
    ("det_gemm", "triton.det_gemm", _scale_increment, "dW"),
])
def test_fp32_class_defects_in_real_kernels_are_red_on_the_default_workload(op, impl, tamper, tensor):
    layouts = ["bn_full", "bn_chunked", "decode"]
    honest = check_kernel(op, impl, layouts=layouts)
    assert honest.ok, honest.first_failure
    planted = check_kernel(op, _wrapped(op, impl, tamper), layouts=layouts)
    assert _reds(planted) == set(layouts)
    for verdict in planted.cells.values():
        bad = [m for m in verdict.tensors if m.accuracy_ok is False]
        assert [m.name for m in bad] == [tensor] and bad[0].accuracy_class == "fp32"
