"""Harness II: a result keyed on a tensor's address instead of its contents must be red.

A kernel that memoises its output, a converted weight or anything else derived from a tensor's values under the
tensor's address is right in every fresh buffer and wrong once the same memory holds new values: the weights
after an optimizer's in-place step, an inference engine's refilled batch buffers. Fresh runs cannot show it, so
the reference layout's last rerun runs in the buffers of a run on other values (``execute.Arena``). Without that
rerun both planted defects below were green on every layout.
"""

from __future__ import annotations

import pytest
import torch

from gradsweep.harness.execute import Arena, decoy_values, run_layout
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.layouts import REFERENCE_LAYOUT, build_calls
from gradsweep.ops.registry import get_op
from gradsweep.results import Status
from gradsweep.workload import Workload
from tests import planted_ops
from tests.helpers import LENGTHS, planted_candidate


def _reds(report) -> dict[str, str]:
    return {lay: report.cells[lay].reason for lay, s in report.statuses().items() if s != Status.GREEN}


def test_output_memoised_by_input_address_is_red_on_the_in_place_rerun():
    planted_ops.OUTPUT_CACHE.clear()
    reds = _reds(check_kernel("planted_rowsum", "torch.address_cached", lengths=LENGTHS))
    assert REFERENCE_LAYOUT in reds
    assert "in the buffers of a run on other values" in reds[REFERENCE_LAYOUT]


def test_weight_converted_once_per_address_is_red_on_the_in_place_rerun():
    planted_ops.WEIGHT_CACHE.clear()
    reds = _reds(check_kernel("planted_scale", "torch.scale_weight_cache", lengths=LENGTHS))
    assert REFERENCE_LAYOUT in reds
    assert "in the buffers of a run on other values" in reds[REFERENCE_LAYOUT]


def test_the_honest_twins_stay_green():
    for op, impl in (("planted_rowsum", "torch.identity_only"), ("planted_scale", "torch.scale_honest")):
        report = check_kernel(op, impl, lengths=LENGTHS)
        assert report.ok, report.first_failure


def _scale_run(candidate, **kwargs) -> None:
    """planted_scale's reference layout run once on the host (``run_layout``'s keywords pass through)."""
    op = get_op("planted_scale")
    run_layout(op, candidate, op.shape_model().model_dump(), Workload(seed=7, lengths=tuple(LENGTHS)),
               build_calls(REFERENCE_LAYOUT, {}, LENGTHS, 7), torch.device("cpu"), **kwargs)


def test_two_runs_through_one_arena_hand_the_same_memory_with_other_values():
    seen: list[dict[str, tuple[int, torch.Tensor]]] = []

    def spy(real, ctx):
        seen[-1].update({n: (t.data_ptr(), t.detach().clone()) for n, t in (*ctx.inputs.items(), *ctx.params.items())})
        return real.run(ctx)

    spied = planted_candidate("planted_scale", "torch.scale_honest", spy, name="torch.scale_spy")
    arena = Arena()
    for decoy in (True, False):
        seen.append({})
        _scale_run(spied, arena=arena, decoy=decoy)
    (first, second) = seen
    assert first.keys() == second.keys() == {"x", "w"}
    for name in first:
        assert first[name][0] == second[name][0], f"{name}: another address in the second run"
        assert torch.equal(first[name][1], decoy_values(second[name][1])), f"{name}: the decoy values"
        assert not torch.equal(first[name][1], second[name][1]), f"{name}: the decoy run saw the real values"


def test_a_decoy_run_without_an_arena_is_refused():
    with pytest.raises(ValueError, match="arena"):
        _scale_run(get_op("planted_scale").candidates["torch.scale_honest"], decoy=True)
