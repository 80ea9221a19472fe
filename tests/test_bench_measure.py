"""The bench's pieces on the CPU: timing statistics, device busy time, phase arithmetic and metrics, the step
runner's layouts, and that its bitwise check can fail (a layout-sensitive candidate is caught, never timed as if
it were fine)."""

from __future__ import annotations

import torch

from gradsweep.bench.cases import Case
from gradsweep.bench.ceilings import Ceiling, Ceilings
from gradsweep.bench.checks import bitwise_record
from gradsweep.bench.data import copies_for, draw
from gradsweep.bench.metrics import family_metrics, phase_ms, settle
from gradsweep.bench.predicate import ImplRecord
from gradsweep.bench.runner import OpStep, chunk_cut, chunked_layout, packed_layout, rows_apart_layout
from gradsweep.bench.subjects import OpSubject
from gradsweep.bench.timing import Budget, CudaTimer, Timing, device_activity, device_spans, merged_busy_ns
from gradsweep.ops.base import CallOutput, Candidate
from gradsweep.ops.registry import get_op

CPU = torch.device("cpu")


def _t(ms: float) -> Timing:
    return Timing.of([ms], 1)


def test_timing_statistics():
    t = Timing.of([4.0, 1.0, 3.0, 2.0, 5.0], 8)
    assert (t.median_ms, t.min_ms, t.max_ms, t.q1_ms, t.q3_ms) == (3.0, 1.0, 5.0, 2.0, 4.0)
    assert t.samples == 5 and t.calls_per_sample == 8
    assert t.spread == (4.0 - 2.0) / 3.0
    single = Timing.of([2.5], 1)
    assert single.q1_ms == single.q3_ms == single.median_ms == 2.5


def test_device_busy_time_merges_overlaps():
    assert merged_busy_ns([]) == 0
    assert merged_busy_ns([(0, 10), (5, 15), (20, 30)]) == 25  # [0, 15) and [20, 30)
    assert merged_busy_ns([(20, 30), (0, 10), (10, 12)]) == 22  # touching intervals join, order irrelevant


def test_only_device_work_counts_as_busy():
    assert device_activity("kernel", False) and device_activity("gpu_memcpy", False)
    assert device_activity("gpu_memset", False)
    assert not device_activity("gpu_user_annotation", False)  # a range drawn around work
    assert not device_activity("kernel", True) and not device_activity("cuda_runtime", False)


def test_bwd_is_the_step_minus_its_forward():
    assert phase_ms("bwd", {"fwd_train": _t(1.5), "fwd_bwd": _t(4.0)}) == 2.5
    assert phase_ms("fwd", {"fwd": _t(1.0)}) == 1.0
    assert phase_ms("fwd_bwd", {"fwd_bwd": _t(3.0)}) == 3.0
    assert phase_ms("bwd", {"fwd_bwd": _t(4.0)}) is None  # a missing half gives no figure, not a guess
    assert phase_ms("bwd", {"fwd_train": _t(1.0), "fwd_bwd": None}) is None


def test_a_bwd_phase_samples_its_two_modes_in_the_same_rounds():
    """The two terms of ``bwd`` (step minus forward) are timed in one round robin with every implementation: a
    clock that drifts between two separate rounds would otherwise land on one term only (planted here: each
    e2e_rounds call runs slower than the last, so timing mode after mode would read 5.0 - 1.0 = 4.0, not 2.0).
    Kernels are read per mode, an implementation's modes back to back."""
    from gradsweep.bench.baselines import Reference
    from gradsweep.bench.measure import _Impl, _measure_all

    class DriftingTimer:
        kind = "planted"

        def __init__(self) -> None:
            self.rounds: list[list[str]] = []
            self.kernel_order: list[str] = []

        def e2e_rounds(self, entries):
            self.rounds.append(list(entries))
            slow = float(len(self.rounds))  # the n-th separate round runs n times slower
            return {k: (_t(slow * e.calls[0]()), None) for k, e in entries.items()}

        def kernels(self, calls):
            self.kernel_order.append(calls[0].__name__)
            return _t(0.5 * calls[0]())

        def backward_kernels(self):
            return None

        def peak_extra_bytes(self, fn):
            return None

    def step(ms: float, name: str):
        def fn() -> float:
            return ms
        fn.__name__ = name
        return fn

    def impl(label: str, scale: float) -> _Impl:
        times = {"fwd_train": 1.0 * scale, "fwd_bwd": 3.0 * scale}
        return _Impl(label, "family", None, lambda mode: Reference([step(times[mode], f"{label}/{mode}")]))

    case = Case("det_gemm", "dx", "dX", {"in_features": 4, "out_features": 4}, (8,), "bwd")
    timer = DriftingTimer()
    got = _measure_all([impl("stock", 1.0), impl("triton", 1.5)], case, timer)  # type: ignore[arg-type]
    assert len(timer.rounds) == 1 and len(timer.rounds[0]) == 4, timer.rounds
    assert got["stock"].e2e_ms == 2.0 and got["triton"].e2e_ms == 3.0
    assert got["stock"].kernels_ms == 1.0
    assert timer.kernel_order == ["stock/fwd_train", "stock/fwd_bwd", "triton/fwd_train", "triton/fwd_bwd"]

    def broken(mode: str) -> Reference | None:
        if mode == "fwd_bwd":
            raise RuntimeError("planted: no backward")
        return Reference([step(1.0, "broken/fwd_train")])

    got = _measure_all([impl("stock", 1.0), _Impl("broken", "family", None, broken)], case,  # type: ignore[arg-type]
                       DriftingTimer())
    assert got["broken"].status == "error" and "planted" in got["broken"].reason
    assert got["stock"].status == "ok" and got["stock"].e2e_ms == 2.0


def test_metrics_against_references_and_ceilings():
    case = Case("rms_norm", "bwd", "bwd", {"hidden": 4}, (1000,), "bwd", anchors=("liger",),
                traffic=lambda s, n: 3.0e6, memory=True)
    mine = settle(ImplRecord(label="triton", kind="family", e2e={"fwd_train": _t(1.0), "fwd_bwd": _t(3.0)},
                             kernels={"fwd_train": _t(0.5), "fwd_bwd": _t(2.0)},
                             issue={"fwd_train": _t(0.9), "fwd_bwd": _t(2.5)}, peak_extra_bytes=2**29), "bwd")
    stock = settle(ImplRecord(label="stock", kind="baseline", e2e={"fwd_train": _t(1.0), "fwd_bwd": _t(5.0)},
                              kernels={"fwd_train": _t(1.0), "fwd_bwd": _t(4.0)}), "bwd")
    absent = ImplRecord(label="liger", kind="anchor", status="absent", reason="not installed")
    ceilings = Ceilings(copy_bandwidth=Ceiling(value=1000.0, unit="GB/s", what="c", timing=_t(1.0)),
                        gemm_rate=Ceiling(value=100.0, unit="TFLOP/s", what="g", timing=_t(1.0)))
    m = family_metrics(case, mine, {"stock": stock, "liger": absent}, ceilings)
    assert m["e2e_vs_stock"] == 2.0 / 4.0
    assert m["kernels_vs_stock"] == 1.5 / 3.0
    assert m["e2e_vs_kernels"] == 2.0 / 1.5
    assert mine.issue_ms == 2.5 - 0.9 and m["host_vs_e2e"] == (2.5 - 0.9) / 2.0
    assert "host_vs_e2e" not in family_metrics(case, settle(ImplRecord(label="t", kind="family", e2e=mine.e2e),
                                                            "bwd"), {}, None)  # no issue times: no figure
    assert m["copy_fraction"] == 3.0e6 / (2.0e-3 * 1000.0e9)
    assert m["peak_extra_gib"] == 0.5
    assert "e2e_vs_liger" not in m and "gemm_fraction" not in m  # absent anchor, no flops declared


def test_layouts_split_every_token_once():
    lengths = (1, 70, 9, 2)
    for layout in (packed_layout(lengths), chunked_layout(lengths), rows_apart_layout(lengths)):
        covered = sorted((s, p) for call in layout for s, start, n in call for p in range(start, start + n))
        assert covered == [(s, p) for s, n in enumerate(lengths) for p in range(n)]
    assert len(chunked_layout(lengths)) == 2 and rows_apart_layout(lengths)[0] == [(0, 0, 1)]
    assert rows_apart_layout((1,)) is None and chunked_layout((1,)) is None
    assert all(chunk_cut(n) % 64 and chunk_cut(n) % 32 for n in (70, 129, 300))  # cuts fall inside tiles


def test_rotation_copies_only_when_data_fits_in_l2():
    assert copies_for(2**20, torch.device("cuda")) == 8
    assert copies_for(2**30, torch.device("cuda")) == 1
    assert copies_for(2**20, CPU) == 1


def _collect(op_name: str, impl: str, layout, lengths, mode="fwd_bwd", shape=None):
    op = get_op(op_name)
    shape = op.shape_model.model_validate(shape or {}).model_dump(exclude_none=True)
    data = draw(op, shape, sum(lengths), CPU, seed=3)
    return OpStep(op, op.candidates[impl], data, shape, lengths, layout, mode).collect()


def test_triton_rms_norm_keeps_its_bits_across_the_split_layouts():
    lengths = (70, 5, 30)
    whole = _collect("rms_norm", "triton.rms_norm", packed_layout(lengths), lengths)
    assert set(whole) == {"y", "dx", "dweight"}
    for layout in (chunked_layout(lengths), rows_apart_layout(lengths)):
        record = bitwise_record("chunks", whole, _collect("rms_norm", "triton.rms_norm", layout, lengths))
        assert record.passed, record.detail


def test_a_layout_sensitive_candidate_fails_the_timed_data_check():
    """Its output depends on how many rows share the call: the bench must report a failed bitwise check."""
    op = get_op("silu")
    honest = op.candidates["torch.silu"]

    def batch_sensitive(ctx):
        x = ctx.inputs["x"]
        nudge = 1.0 + (x.shape[0] % 2) * 2.0 ** -6
        return CallOutput({"y": torch.nn.functional.silu(x * nudge)})

    planted = Candidate("planted.silu", "torch", batch_sensitive)
    case = Case("silu", "fwd", "fwd", {"features": 16}, (9, 4), "fwd", split="rows")
    subject = OpSubject(case, op, {"triton": planted}, CPU, seed=1)
    record = subject.bitwise("triton")
    assert record is not None and not record.passed and "y:" in record.detail
    subject = OpSubject(case, op, {"triton": honest}, CPU, seed=1)
    assert subject.bitwise("triton").passed


def test_a_failed_check_fails_the_run_and_is_recorded_on_the_case():
    from gradsweep.bench.api import summarise, verdict
    from gradsweep.bench.measure import run_case
    from gradsweep.bench.suite import Slot
    from gradsweep.bench.timing import Budget, HostTimer
    from gradsweep.manifest import MANIFEST_DIR

    def batch_sensitive(ctx):
        x = ctx.inputs["x"]
        return CallOutput({"y": torch.nn.functional.silu(x * (1.0 + (x.shape[0] % 2) * 2.0 ** -6))})

    planted = Candidate("planted.silu", "triton", batch_sensitive)
    case = Case("silu", "fwd", "fwd", {"features": 16}, (9, 4), "fwd", split="rows")
    record = run_case(case, [Slot("triton", "planted_profile", planted)], HostTimer(Budget.quick()), CPU, 1, None,
                      [], MANIFEST_DIR / "contract.yaml", [9, 3, 14])
    fam = record.families["triton"]
    assert fam.status == "check_failed" and "timed data" in fam.reason
    assert {c.kind: c.passed for c in fam.checks} == {"bitwise": False, "contract": False}
    assert record.references["stock"].status == "ok" and fam.measured.e2e_ms is not None
    summary = summarise([record])
    assert summary.checks_failed == 2 and verdict(summary).exit_code == 1


def test_device_spans_read_the_public_profiler_events():
    """Kernels-only time comes from the profiler's public event list (torch 2.11 has no kineto activity_type)."""
    from types import SimpleNamespace

    def ev(name, dev, start, end, annotation=False):
        return SimpleNamespace(name=name, device_type=dev, is_user_annotation=annotation,
                               time_range=SimpleNamespace(start=start, end=end))

    prof = SimpleNamespace(events=lambda: [ev("gemm_kernel", "cuda", 1.0, 3.0), ev("aten::mm", "cpu", 0.0, 9.0),
                                           ev("step", "cuda", 0.0, 10.0, annotation=True),
                                           ev("Memcpy DtoD", "cuda", 2.0, 4.0)])
    spans = device_spans(prof, "cuda")
    assert spans == [(1000, 3000), (2000, 4000)] and merged_busy_ns(spans) == 3000


class _FakeCudaClock:
    """Stands in for ``torch`` inside CudaTimer on a CPU box: events whose elapsed time is a fixed device time per
    recorded call, so the host clock (the issue time) and the device clock (e2e) can be told apart."""

    def __init__(self, device_ms_per_call: float) -> None:
        self.per_call, self.calls, self.marks = device_ms_per_call, 0, []
        clock = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = 0

            def record(self) -> None:
                self.at = clock.calls

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end: Event) -> float:
                return (end.at - self.at) * clock.per_call

        self.cuda = type("cuda", (), {"Event": Event, "synchronize": staticmethod(lambda: None)})


def test_cuda_timer_issue_time_is_the_host_clock_of_the_same_samples():
    """e2e comes from the events, the issue time from the host's clock around the same calls: a host-bound step
    (here: 2 ms of host per call against 0.5 ms of device) shows issue >= its host time, a device-bound one
    (0.01 ms of host against 5 ms of device) an issue time far under its e2e."""
    import time

    from gradsweep.bench.timing import Budget, CudaTimer

    for host_ms, device_ms in ((2.0, 0.5), (0.01, 5.0)):
        timer = CudaTimer(Budget(target_s=0.02, sample_ms=4.0, min_samples=3, max_samples=3, warmup=1))
        fake = _FakeCudaClock(device_ms)
        timer.torch = fake

        def call(fake=fake, host_ms=host_ms) -> None:
            end = time.perf_counter() + host_ms * 1e-3
            while time.perf_counter() < end:
                pass
            fake.calls += 1

        e2e, issue = timer.e2e_host([call])
        assert e2e.median_ms == device_ms and e2e.samples == 3
        assert issue is not None and issue.samples == 3 and issue.calls_per_sample == e2e.calls_per_sample
        assert host_ms <= issue.median_ms < host_ms + 1.0, issue
    assert timer.e2e([call]).median_ms == 5.0  # e2e alone: the same device figure


def test_cuda_timer_takes_the_samples_of_a_case_in_turn():
    """e2e_rounds interleaves the implementations' samples (a drifting host slows each alike), runs each batch
    inside its entry's context, and an entry whose calls raise gets its exception while the others finish."""
    import contextlib

    from gradsweep.bench.timing import Budget, CudaTimer, Entry

    timer = CudaTimer(Budget(target_s=0.001, sample_ms=1.0, min_samples=3, max_samples=3, warmup=1,
                             e2e_block_ms=None))  # every entry in the rounds (blocks: the test below)
    timer.torch = fake = _FakeCudaClock(2.0)
    order: list[str] = []
    inside = {"b": False}

    def call(name: str):
        def run() -> None:
            if name == "bad" and len([o for o in order if o == "bad"]) >= 2:
                raise RuntimeError("planted: fails on its third call")
            assert name != "b" or inside["b"], "b ran outside its context"
            order.append(name)
            fake.calls += 1
        return run

    @contextlib.contextmanager
    def b_context():
        inside["b"] = True
        yield
        inside["b"] = False

    got = timer.e2e_rounds({"a": Entry([call("a")]), "b": Entry([call("b")], b_context),
                            "bad": Entry([call("bad")])})
    assert isinstance(got["bad"], RuntimeError)
    assert got["a"][0].median_ms == 2.0 and got["a"][0].samples == 3 and got["b"][0].samples == 3
    timed = [o for o in order[6:] if o != "bad"]  # after each one's warm-up and first timed call
    assert timed == ["a", "b"] * 3, order


def test_device_bound_entries_are_timed_in_a_heated_block_after_the_rounds() -> None:
    """An entry whose first timed call keeps the (fake) device busy >= ``e2e_block_ms`` while its host issues it in
    under half that time is timed apart: ``kernel_heat_ms`` of its own calls, then its samples back to back, so its
    clocks are its own and not the previous side's; a host-bound entry stays in the rounds; the quick budget (CPU
    smoke) never blocks."""
    import time

    from gradsweep.bench.timing import Budget, CudaTimer, Entry

    timer = CudaTimer(Budget(target_s=0.001, sample_ms=1.0, min_samples=3, max_samples=3, warmup=1,
                             kernel_heat_ms=5.0, e2e_block_ms=1.0))
    timer.torch = fake = _FakeCudaClock(2.0)
    order: list[str] = []

    def call(name: str, host_ms: float):
        def run() -> None:
            end = time.perf_counter() + host_ms * 1e-3
            while time.perf_counter() < end:
                pass
            order.append(name)
            fake.calls += 1
        return run

    got = timer.e2e_rounds({"dev": Entry([call("dev", 0.0)]), "host": Entry([call("host", 1.5)])})
    assert got["dev"][0].median_ms == 2.0 and got["dev"][0].samples == 3 and got["host"][0].samples == 3
    timed = order[4:]  # after each one's warm-up and first timed call (the plan)
    assert timed[:3] == ["host"] * 3, timed[:6]  # the rounds (one entry in them)
    assert set(timed[3:]) == {"dev"} and len(timed[3:]) > 3  # the heat, then dev's three samples
    assert Budget.quick().e2e_block_ms is None


def test_kernels_rounds_follow_a_burst_of_the_same_calls() -> None:
    """Before a profiled round the timer runs the round's own calls back to back for ``kernel_heat_ms`` (the device's
    sustained clocks, not an idle device's boost), rotating through the data copies as the timed calls do; the quick
    budget (CPU smoke, tests) skips it."""
    seen: list[int] = []
    calls = [lambda i=i: seen.append(i) for i in range(3)]
    timer = CudaTimer(Budget(kernel_heat_ms=20.0))
    timer._heat(calls)
    assert len(seen) > 3 and seen[:4] == [0, 1, 2, 0]
    seen.clear()
    CudaTimer(Budget.quick())._heat(calls)
    assert seen == [] and Budget.quick().kernel_heat_ms == 0.0


def test_ceilings_carry_the_runs_host_figures_and_old_evidence_reads_without_them() -> None:
    """The host figures beside the ceilings (a stock torch launch, a fixed Python loop) are measured in the same
    run, shown where the ceilings are, and optional: evidence written before them parses and shows none."""
    from gradsweep.bench.ceilings import Ceilings, measure_ceilings
    from gradsweep.bench.timing import Budget, HostTimer

    ceilings = measure_ceilings(HostTimer(Budget.quick()), CPU, quick=True)
    assert ceilings.host_launch is not None and ceilings.host_python is not None
    assert 0 < ceilings.host_launch.value < 1e5 and ceilings.host_launch.unit == "us"
    assert 0 < ceilings.host_python.value < 1e5 and ceilings.host_python.timing.samples > 1
    text = ceilings.host_text()
    assert text.startswith("; host: torch launch ") and f"{ceilings.host_python.value:.1f} us" in text
    old = Ceilings.model_validate(ceilings.model_dump(exclude={"host_launch", "host_python"}))
    assert old.host_launch is None and old.host_text() == ""


def test_ceilings_carry_the_autograd_floor_and_older_evidence_reads_without_it() -> None:
    """The floor under every bwd row: a backward through one stock node and through one Python autograd Function,
    both measured; the Python node is a real Python node (its backward runs, its gradient passes through); files
    from before the pair parse and show the other host figures only."""
    from gradsweep.bench.ceilings import Ceilings, _passthrough_node, measure_ceilings
    from gradsweep.bench.timing import Budget, HostTimer

    ceilings = measure_ceilings(HostTimer(Budget.quick()), CPU, quick=True)
    stock, python = ceilings.host_autograd_stock, ceilings.host_autograd_python
    assert stock is not None and python is not None
    assert 0 < stock.value < 1e5 and 0 < python.value < 1e5 and stock.unit == python.unit == "us"
    assert python.timing.samples > 1 and "Python autograd.Function" in python.what
    text = ceilings.host_text()
    assert f"one stock node {stock.value:.1f} us / one Python Function {python.value:.1f} us" in text
    node = _passthrough_node()
    leaf = torch.arange(4.0, requires_grad=True)
    out = node.apply(leaf)
    assert type(out.grad_fn).__name__ == "PassthroughBackward"  # a Python node, not a view node of torch's
    (grad,) = torch.autograd.grad([out], [leaf], [torch.full((4,), 3.0)])
    assert torch.equal(grad, torch.full((4,), 3.0))
    old = Ceilings.model_validate(ceilings.model_dump(exclude={"host_autograd_stock", "host_autograd_python"}))
    assert old.host_autograd_python is None and old.host_text().startswith("; host: torch launch ")
    assert "stock node" not in old.host_text()
