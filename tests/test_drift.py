"""Drift attribution names the first stage where train-style and inference-style runs part."""

from __future__ import annotations

import torch

from gradsweep.drift import ChainStage, attribute_drift
from gradsweep.layouts import build_calls
from gradsweep.ops.registry import get_op
from gradsweep.workload import Workload
from tests import planted_ops  # noqa: F401  (registers planted_rowsum)
from tests.helpers import LAYOUTS, LENGTHS


class _Spec:
    def __init__(self, **kw):
        self.chunks = kw.get("chunks")
        self.order = kw.get("order")
        self.filler_lengths = kw.get("filler_lengths")


def _calls(name):
    return build_calls(name, _Spec(**LAYOUTS[name]), LENGTHS, 7)


def _chain(impl: str):
    stages = [ChainStage("silu", {"features": 256}), ChainStage("planted_rowsum", {"features": 256}, {"x": "y"})]
    cands = [get_op("silu").candidates["torch.silu"], get_op("planted_rowsum").candidates[impl]]
    return stages, cands


def test_drift_enters_at_the_layout_sensitive_stage():
    stages, cands = _chain("torch.splitk")
    report = attribute_drift(stages, cands, Workload(7, tuple(LENGTHS)), ("bn_full", _calls("bn_full")),
                             ("b1_singleton", _calls("b1_singleton")), torch.device("cpu"))
    first = report.first_divergence
    assert first is not None and first.stage == 1 and first.op == "planted_rowsum"
    assert report.stages[0].bitwise_equal and report.stages[0].max_abs == 0.0
    assert first.mismatched > 0 and first.max_abs > 0 and first.p99_abs <= first.max_abs
    assert report.growth()[0] is None


def test_no_drift_for_an_invariant_chain():
    stages, cands = _chain("torch.identity_only")
    report = attribute_drift(stages, cands, Workload(7, tuple(LENGTHS)), ("bn_full", _calls("bn_full")),
                             ("decode", _calls("decode")), torch.device("cpu"))
    assert report.first_divergence is None
    assert all(s.mismatched == 0 and s.numel > 0 for s in report.stages)
