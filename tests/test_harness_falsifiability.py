"""The matrix must be able to go red: planted defects are caught, an honest op is green."""

from __future__ import annotations

import pytest
import torch

from gradsweep.contract import load_contract
from gradsweep.harness import assert_gradient_batch_invariant, run_cell
from gradsweep.harness.cell import clear_cache, workload_of
from gradsweep.harness.execute import run_layout
from gradsweep.harness.invariance import InvarianceError, LayoutConfig, assert_forward_batch_invariant
from gradsweep.layouts import build_calls
from gradsweep.ops.registry import get_op
from gradsweep.results import CellKey, Status
from tests import planted_ops
from tests.helpers import load_dict, planted_manifest_dict


def _verdicts(tmp_path, impl: str) -> dict[str, Status]:
    clear_cache()
    m = load_dict(tmp_path, planted_manifest_dict(impl))
    return {k.layout: run_cell(m, k).status for k in m.cells()}


def test_batch_size_dependent_reduction_is_red_on_exactly_the_predicted_layouts(tmp_path):
    # split-K only in calls of <= 8 rows: b1_singleton (samples of 5 and 1 tokens), bn_neighbors (a call
    # of samples 1 and 3: 6 rows) and decode (at most 5 rows a call) take it; every other layout's calls
    # have more than 8 rows.
    m = load_dict(tmp_path, planted_manifest_dict("torch.splitk"))
    predicted = {lay for lay in m.layouts
                 if any(c.num_rows <= planted_ops.SPLIT_THRESHOLD
                        for c in build_calls(lay, m.layouts[lay], m.samples.lengths, m.seed))}
    assert predicted == {"b1_singleton", "bn_neighbors", "decode"}
    verdicts = _verdicts(tmp_path, "torch.splitk")
    red = {lay for lay, s in verdicts.items() if s == Status.RED_VERDICT}
    assert red == predicted
    assert all(verdicts[lay] == Status.GREEN for lay in verdicts if lay not in predicted)


def test_nondeterministic_reduction_is_red_even_against_its_own_rerun(tmp_path):
    verdicts = _verdicts(tmp_path, "torch.random_order")
    assert verdicts["bn_full"] == Status.RED_VERDICT
    assert all(s == Status.RED_VERDICT for s in verdicts.values())


def test_logical_identity_only_operator_is_green_everywhere(tmp_path):
    verdicts = _verdicts(tmp_path, "torch.identity_only")
    assert set(verdicts.values()) == {Status.GREEN}


def test_adapter_running_every_call_as_n_times_b1_is_caught_by_the_canary(tmp_path):
    # The same split-K kernel behind an adapter that silently runs each sample alone: every
    # layout then computes the same thing, and the canary's predicted reds vanish. A harness (or
    # adapter) that compares a computation with itself is exposed by that mismatch.
    honest = _verdicts(tmp_path, "torch.splitk")
    cheat = _verdicts(tmp_path, "torch.per_sample_cheat")
    assert honest["b1_singleton"] == Status.RED_VERDICT
    assert cheat["b1_singleton"] == Status.GREEN
    assert {lay for lay, s in cheat.items() if s != Status.GREEN} != {
        lay for lay, s in honest.items() if s != Status.GREEN}


def test_adapter_ignoring_the_layout_is_red(tmp_path):
    verdicts = _verdicts(tmp_path, "torch.layout_ignoring")
    assert set(verdicts.values()) == {Status.RED_VERDICT}
    m = load_dict(tmp_path, planted_manifest_dict("torch.layout_ignoring"))
    result = run_cell(m, CellKey(op="planted_rowsum", profile="planted", layout="bn_chunked"))
    assert "adapter" in result.reason


def test_missing_backward_is_categorised_not_a_stack_trace(tmp_path):
    m = load_dict(tmp_path, planted_manifest_dict("torch.no_backward"))
    result = run_cell(m, CellKey(op="planted_rowsum", profile="planted", layout="bn_chunked"))
    assert result.status == Status.RED_NO_BACKWARD
    op = get_op("planted_rowsum")
    configs = [LayoutConfig(lay, build_calls(lay, m.layouts[lay], m.samples.lengths, m.seed))
               for lay in ("bn_full", "b1_singleton")]
    report = assert_gradient_batch_invariant(op, configs, load_contract(m.contract_path),
                                             candidate=op.candidates["torch.no_backward"],
                                             workload=workload_of(m), shape=m.shape(op.name),
                                             raise_on_failure=False)
    assert report.missing_backward is not None and not report.ok
    assert "missing backward" in report.first_failure


def test_invariance_api_reports_first_failure_and_raises(tmp_path):
    m = load_dict(tmp_path, planted_manifest_dict("torch.splitk"))
    op = get_op("planted_rowsum")
    configs = [LayoutConfig(lay, build_calls(lay, m.layouts[lay], m.samples.lengths, m.seed))
               for lay in ("bn_full", "bn_chunked", "b1_singleton")]
    kwargs = dict(candidate=op.candidates["torch.splitk"], workload=workload_of(m), shape=m.shape(op.name))
    with pytest.raises(InvarianceError) as info:
        assert_forward_batch_invariant(op, configs, load_contract(m.contract_path), **kwargs)
    report = info.value.report
    assert [p.diff.equal for p in report.pairs] == [True, False]
    assert "b1_singleton vs bn_full" in report.first_failure and report.first_failure.startswith("planted_rowsum")
    bad = report.pairs[1].diff
    assert bad.mismatched > 0 and bad.max_abs > 0


class _Spy:
    """Records what the operator itself receives on each call."""

    def __init__(self):
        self.seen: list[tuple[int, torch.Tensor, torch.Tensor]] = []

    def candidate(self):
        from gradsweep.ops.base import CallOutput, Candidate

        def run(ctx):
            x = ctx.inputs["x"]
            self.seen.append((x.shape[0], ctx.rows.sample.clone(), x.detach().float().clone()))
            return CallOutput({"y": (x.float() * planted_ops.coefficients(x.shape[1], x.device)).sum(-1, True)})
        return Candidate("torch.spy", "torch", run)


@pytest.mark.parametrize("layout, expected_rows", [
    ("bn_full", [130]), ("bn_chunked", [34, 56, 40]), ("b1_singleton", [37, 5, 64, 1, 23]),
    ("bn_padded_right", [5 * 64]), ("bn_padded_left", [5 * 64]), ("bn_permuted", [130]),
    ("bn_mask_density", [130 + 9 + 16 + 3 + 9 + 16]), ("bn_neighbors", [64 + 37, 5 + 1, 23]),
    ("prefix_cache", [20 + 2 + 1 + 1 + 10, 9 + 2 + 32 + 7, 8 + 1 + 31 + 6]),
])
def test_layouts_reach_the_operator_as_declared(tmp_path, layout, expected_rows):
    m = load_dict(tmp_path, planted_manifest_dict("torch.identity_only"))
    spy = _Spy()
    calls = build_calls(layout, m.layouts[layout], m.samples.lengths, m.seed)
    run = run_layout(get_op("planted_rowsum"), spy.candidate(), m.shape("planted_rowsum"), workload_of(m), calls,
                     torch.device("cpu"))
    assert [n for n, _, _ in spy.seen] == expected_rows == run.call_rows
    if layout.startswith("bn_padded"):
        _, sample, x = spy.seen[0]
        pads = sample < 0
        assert pads.sum() == 5 * 64 - 130  # padding reaches the operator ...
        assert (~torch.isfinite(x[pads])).any(-1).all()  # ... as NaN / inf garbage, never as silent zeros
        first_real = int(torch.nonzero(~pads)[0])
        assert (first_real == 0) == (layout == "bn_padded_right")
    if layout == "bn_permuted":
        _, sample, _ = spy.seen[0]
        firsts = [int(s) for i, s in enumerate(sample) if i == 0 or sample[i - 1] != s]
        assert firsts == [3, 0, 4, 2, 1]
    if layout == "bn_chunked":
        # chunking splits samples: sample 0 appears in two calls with positions 0..19 then 20..36
        s0 = [(sample == 0).sum().item() for _, sample, _ in spy.seen]
        assert s0 == [20, 17, 0]
    if layout == "bn_neighbors":  # every sample once, beside other neighbours than in bn_full
        groups = [[int(s) for i, s in enumerate(sample) if i == 0 or sample[i - 1] != s] for _, sample, _ in spy.seen]
        assert groups == [[2, 0], [1, 3], [4]]
    if layout == "prefix_cache":  # one request writes every prefix; two continuations reuse it
        firsts = [sorted({int(s) for s in sample}) for _, sample, _ in spy.seen]
        assert firsts == [[0, 1, 2, 3, 4], [0, 1, 2, 4], [0, 1, 2, 4]]
