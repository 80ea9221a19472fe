"""A bwd case's kernels-only figure read inside the training step (gradsweep/bench/backward_mark.py): the steps mark
their backward only in profiled rounds, the trace's device work is put in the backward by the launch that started
inside a mark, an unlinked launch or a missing mark gives no figure (never a short one), and a ratio never mixes
a figure read inside the step with one derived as the step minus its forward."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.bench.backward_mark import MARK, backward_section, backward_spans, marking
from gradsweep.bench.baselines import Reference, function_step
from gradsweep.bench.cases import Case
from gradsweep.bench.data import draw
from gradsweep.bench.metrics import BWD_IN_STEP, family_metrics, phase_ms, settle
from gradsweep.bench.predicate import ImplRecord
from gradsweep.bench.runner import OpStep, packed_layout
from gradsweep.bench.timing import Timing, _in_step_backward, device_activity
from gradsweep.ops.registry import get_op


@dataclass
class Ev:
    """A raw kineto event as the trace gives it (torch 2.11 and 2.13 accessors)."""

    _name: str
    device: str
    corr: int
    start: int
    dur: int

    def name(self) -> str:
        return self._name

    def device_type(self) -> str:
        return f"DeviceType.{self.device}"

    def correlation_id(self) -> int:
        return self.corr

    def start_ns(self) -> int:
        return self.start

    def duration_ns(self) -> int:
        return self.dur


def _work(e) -> bool:
    return device_activity(e.name(), False)


def _trace() -> list[Ev]:
    """One step: a forward kernel, then the marked backward launching two kernels (one from a driver call, as
    Triton's launcher makes it) and a memset; the mark's own device-side range; a CPU op sharing an id."""
    return [
        Ev("aten::mm", "CPU", 7, 0, 50),  # a torch op: its id lives in another space, never a launch
        Ev("cudaLaunchKernel", "CPU", 100, 10, 5),
        Ev("fwd_gemm", "CUDA", 100, 20, 30),
        Ev(MARK, "CPU", 3, 60, 100),
        Ev(MARK, "CUDA", 3, 70, 80),  # the mark drawn on the device timeline: a range, not work
        Ev("cuLaunchKernelEx", "CPU", 101, 65, 5),
        Ev("cudnn_convolution", "CPU", 101, 0, 5),  # a torch op whose id collides with the launch's: not a launch
        Ev("dw_fold", "CUDA", 101, 80, 40),
        Ev("cudaMemsetAsync", "CPU", 102, 150, 2),
        Ev("Memset (Device)", "CUDA", 102, 125, 10),
    ]


def test_device_work_launched_inside_the_mark_is_the_backward():
    marks, spans = backward_spans(_trace(), _work)
    assert marks == 1
    assert sorted(spans) == [(80, 120), (125, 135)]  # the fold and the memset; not the forward, not the range


def test_an_unlinked_device_event_gives_no_figure():
    trace = [e for e in _trace() if e.name() != "cuLaunchKernelEx"]  # the fold's launch missing from the trace
    assert backward_spans(trace, _work) is None


def test_a_round_without_a_mark_per_call_gives_no_figure():
    class Prof:
        def __init__(self, events):
            self.profiler = type("P", (), {"kineto_results": type("K", (), {"events": lambda _: events})()})()

    one = Prof(_trace())
    assert _in_step_backward(one, 1, []) == [50 / 1e6]  # [80, 120) + [125, 135): 50 ns
    assert _in_step_backward(one, 2, []) is None  # two calls profiled, one mark: a step drew none
    assert _in_step_backward(one, 1, None) is None  # an earlier round already failed: no figure at all


def test_the_mark_is_drawn_only_while_marking():
    def marks(on: bool) -> int:
        x = torch.randn(8, 8, requires_grad=True)
        step = function_step(lambda t: [t["x"] @ t["x"]], {"x": x}, ("x",), [torch.ones(8, 8)], "fwd_bwd")
        ctx = marking() if on else backward_section()  # the latter: a no-op outside marking
        with profile(activities=[ProfilerActivity.CPU]) as prof, ctx:
            for _ in range(3):
                step()
        return sum(e.name == MARK for e in prof.events())

    assert marks(True) == 3
    assert marks(False) == 0


def test_the_op_step_marks_its_backward_and_folds_inside_one_range():
    op = get_op("rms_norm")
    stock = op.candidates["torch.rms_norm"]
    shape = op.shape_model.model_validate({"hidden": 16}).model_dump(exclude_none=True)
    data = draw(op, shape, 12, torch.device("cpu"), 0)
    train = OpStep(op, stock, data, shape, (5, 7), packed_layout((5, 7)), "fwd_bwd")
    fwd = OpStep(op, stock, data, shape, (5, 7), packed_layout((5, 7)), "fwd_train")
    with marking(), profile(activities=[ProfilerActivity.CPU]) as prof:
        train()
        train()
        fwd()
    ranges = [e for e in prof.events() if e.name == MARK]
    assert len(ranges) == 2  # one per training step, none for the forward-only step
    inside = {e.name for e in prof.events() if any(
        r.time_range.start <= e.time_range.start <= r.time_range.end for r in ranges)}
    assert any("backward" in n.lower() or "Backward" in n for n in inside), sorted(inside)[:20]


def _rec(label: str, kernels: dict[str, float]) -> ImplRecord:
    return settle(ImplRecord(label=label, kind="family", e2e={"fwd_train": Timing.of([1.0], 1),
                                                               "fwd_bwd": Timing.of([3.0], 1)},
                             kernels={k: Timing.of([v], 1) for k, v in kernels.items()}), "bwd")


def test_kernels_ms_is_the_in_step_figure_and_ratios_never_mix_readings():
    case = Case("det_gemm", "dw", "dW", {"in_features": 4, "out_features": 4}, (8,), "bwd")
    direct = _rec("cuda", {"fwd_train": 1.0, "fwd_bwd": 3.0, BWD_IN_STEP: 1.6})
    assert direct.kernels_ms == 1.6  # read inside the step, not 3.0 - 1.0
    derived_ref = _rec("stock", {"fwd_train": 1.0, "fwd_bwd": 2.0})
    direct_ref = _rec("stock", {"fwd_train": 1.0, "fwd_bwd": 2.0, BWD_IN_STEP: 0.8})
    assert family_metrics(case, direct, {"stock": direct_ref}, None)["kernels_vs_stock"] == 1.6 / 0.8
    # only one side read inside its step: both sides derived, (3 - 1) / (2 - 1)
    assert family_metrics(case, direct, {"stock": derived_ref}, None)["kernels_vs_stock"] == 2.0
    assert family_metrics(case, direct, {"stock": derived_ref}, None)["e2e_vs_kernels"] == 2.0 / 1.6
    assert phase_ms("fwd_bwd", {"fwd_bwd": Timing.of([3.0], 1), BWD_IN_STEP: Timing.of([1.0], 1)}) == 3.0


def test_measure_records_the_timer_s_in_step_figure_for_a_bwd_case_only():
    from gradsweep.bench.measure import _Impl, _measure_all

    class Timer:
        kind = "planted"

        def __init__(self):
            self.last = None

        def e2e_rounds(self, entries):
            return {k: (Timing.of([e.calls[0]()], 1), None) for k, e in entries.items()}

        def kernels(self, calls):
            self.last = calls[0]()
            return Timing.of([self.last], 1)

        def backward_kernels(self):
            return Timing.of([0.25 * self.last], 1)

        def peak_extra_bytes(self, fn):
            return None

    times = {"fwd": 1.0, "fwd_train": 1.0, "fwd_bwd": 3.0}
    impl = _Impl("cuda", "family", None, lambda mode: Reference([lambda m=mode: times[m]]))
    bwd = Case("det_gemm", "dw", "dW", {"in_features": 4, "out_features": 4}, (8,), "bwd")
    got = _measure_all([impl], bwd, Timer())["cuda"]  # type: ignore[arg-type]
    assert got.kernels[BWD_IN_STEP].median_ms == 0.75 and got.kernels_ms == 0.75
    fwd = Case("det_gemm", "fwd", "fwd", {"in_features": 4, "out_features": 4}, (8,), "fwd")
    got = _measure_all([impl], fwd, Timer())["cuda"]  # type: ignore[arg-type]
    assert BWD_IN_STEP not in got.kernels and got.kernels_ms == 1.0
