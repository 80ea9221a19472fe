"""How long a call takes, two ways, and how much memory it adds.

- **end to end** (``e2e``): what a training step pays. Calls of the public function run back to back between
  two CUDA events, the device synchronised before the first: host planning, uploads and launches overlap the
  device as they do in a trainer, and whichever is slower sets the time. A sample batches enough calls to
  last about ``sample_ms`` (10 ms): the first call's host lead (its planning and launch before the device has
  work) is paid once per sample, as a trainer pays it once per synchronised step, not once per call. With 2 ms
  samples a 0.3-0.6 ms call ran 3-4 to a sample and that lead added 10-20% to it (same H200 box, alternating:
  Triton decode 385 -> 330 us, the canonical dW at T = 4096 683 -> 584 us, SDPA and cuBLAS unchanged; notes/
  triton_rowwise.md). The timed loop rotates over the case's data copies (L2).
- **kernels only** (``kernels``): the device busy time of the same calls, from the profiler: every device
  activity (kernels, copies, memsets; annotations excluded), overlapping intervals merged, host gaps removed,
  divided by the calls profiled. One sample per profiled round (``Budget.kernel_rounds``; a profiling session
  costs far more than a short call, so the default is one round of ``kernel_calls`` calls). Each round follows
  ``Budget.kernel_heat_ms`` of the same calls back to back, so that the device runs at the clocks it holds
  under sustained load, as it does through the end-to-end samples: at its 700 W limit the H200 drops a
  GEMM-bound step from ~1.83 to ~1.45 GHz within a quarter of a second, and a round profiled from an idle
  device then reads the kernels of a boosted device (the CUDA dW step at T = 16384: 1.45 ms of kernels from
  idle, 1.70 ms after 300 ms of steps, 1.83 ms per step end to end; cuBLAS's 1.34 / 1.60 / 1.60 ms;
  notes/kernels_cuda.md). Without it ``e2e / kernels`` charged the clock drop to the host.
- **the backward inside the step** (``backward_kernels``): the same profiled rounds also mark each step's backward
  on the host (``backward_mark``) and sum the device work launched inside the marks, so a ``bwd`` case's
  kernels-only figure is read in the training step itself instead of as the step minus a separately profiled
  forward round (which moved ~10% between runs).
- **peak extra memory**: the allocator's peak during one call above what was allocated before it.
- **round robin** (``e2e_rounds``): the end-to-end samples of a case's implementations (the stock path, the
  anchors, every family) are taken in turn, sample 1 of each, then sample 2 of each, ...: a host whose speed
  drifts over the seconds of a case (measured on lent H200 boxes: the same stock call 25.0 then 19.5 us a minute
  apart) slows every side alike instead of whichever was timed in the slow minute, and no side is always timed
  first. Each implementation keeps its own calls per sample and sample count (set by its own speed). The modes
  of a ``bwd`` phase (the step and its forward, subtracted) are entries of the same rounds (``measure``).
- **device-bound entries in a block** (``Budget.e2e_block_ms``): an entry whose first timed call keeps the device
  busy for at least that long while its host issues it in under half the time is timed apart from the rounds:
  ``kernel_heat_ms`` of its own calls back to back, then its samples one after another. In rounds such a sample
  ran at the clocks the *previous* side's sample left: on 2026-12-04 the cuBLAS reference of linear_logp at
  T = 16384 read 26.1-26.2 ms in some samples and 30.7-33.9 in others (its kernels-only figure after the heat:
  29.4 ms), so the end-to-end ratios of power-hungry cases followed the order of the sides. A device-bound
  sample does not see the host's drift, which the rounds are for; the block times every side at its own
  sustained clocks, as its kernels-only round does.

Each timing is the median of its samples with the spread (quartiles, min, max). ``HostTimer`` is the CPU
smoke's wall clock (no device, no kernels figure); tests plant their own timer with the same interface.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from gradsweep.bench.backward_mark import backward_spans, marking

Fn = Callable[[], object]
T = TypeVar("T")


class Timing(BaseModel):
    """Milliseconds per call: the median over ``samples`` samples of ``calls_per_sample`` calls each."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    median_ms: float
    q1_ms: float
    q3_ms: float
    min_ms: float
    max_ms: float
    samples: int
    calls_per_sample: int

    @staticmethod
    def of(per_call_ms: Sequence[float], calls_per_sample: int) -> Timing:
        values = sorted(float(v) for v in per_call_ms)
        if not values:
            raise ValueError("a timing needs at least one sample")
        if len(values) >= 2:
            q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        else:
            q1 = q3 = values[0]
        return Timing(median_ms=statistics.median(values), q1_ms=q1, q3_ms=q3, min_ms=values[0],
                      max_ms=values[-1], samples=len(values), calls_per_sample=calls_per_sample)

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median (0.05: the middle half of the samples within 5%)."""
        return (self.q3_ms - self.q1_ms) / self.median_ms if self.median_ms > 0 else 0.0


@dataclass(frozen=True)
class Budget:
    """How much timing each measurement gets."""

    target_s: float = 0.15      # timed calls per measurement (after warm-up)
    sample_ms: float = 10.0     # calls batched per e2e sample so that one sample lasts about this long
    min_samples: int = 5
    max_samples: int = 30
    warmup: int = 2             # untimed calls first (compilation, autotuning, allocator)
    kernel_rounds: int = 1      # profiled rounds (one kernels sample each)
    kernel_calls: int = 4       # calls per profiled round (at least one per data copy)
    kernel_heat_ms: float = 120.0  # calls back to back before each profiled round (the device's sustained clocks)
    e2e_block_ms: float | None = 0.1  # a device-bound call this long is timed in a heated block (None: never)

    @staticmethod
    def quick() -> Budget:
        return Budget(target_s=0.03, sample_ms=1.0, min_samples=3, max_samples=5, warmup=1, kernel_rounds=1,
                      kernel_calls=2, kernel_heat_ms=0.0, e2e_block_ms=None)


@dataclass(frozen=True)
class Entry:
    """One implementation of a case for ``Timer.e2e_rounds``: its calls and the context its timing runs in."""

    calls: Sequence[Fn]
    context: Callable[[], contextlib.AbstractContextManager[Any]] = field(default=contextlib.nullcontext)


Rounds = dict[str, "tuple[Timing, Timing | None] | Exception"]


class Timer(Protocol):
    """What the suite needs from a clock (``kind`` names it in the evidence)."""

    kind: str

    def e2e(self, calls: Sequence[Fn]) -> Timing: ...

    def e2e_host(self, calls: Sequence[Fn]) -> tuple[Timing, Timing | None]:
        """(end to end, host time per call spent issuing the same samples' calls; None where the clock is the
        host's own)."""
        ...

    def e2e_rounds(self, entries: dict[str, Entry]) -> Rounds:
        """``e2e_host`` of every entry, their samples taken in turn; an entry whose calls raise gets its
        exception (the others go on)."""
        ...

    def kernels(self, calls: Sequence[Fn]) -> Timing | None: ...

    def backward_kernels(self) -> Timing | None:
        """The backward's device time per call, read inside the last ``kernels`` round's steps (``backward_mark``);
        None where not every step marked its backward once or a device event could not be linked to its launch."""
        ...

    def host(self, fn: Fn) -> Timing: ...

    def peak_extra_bytes(self, fn: Fn) -> int | None: ...

    def describe(self) -> dict[str, object]: ...


def device_activity(activity: object, annotation: bool) -> bool:
    """A device event that is work (a kernel, copy or memset), not a range drawn around work.

    ``activity`` is a kineto activity type or a device event's name: a kernel's name need not say "kernel",
    so any named device event counts unless it is an annotation or the runtime itself.
    """
    name = str(activity).lower()
    if annotation or "annotation" in name or "runtime" in name:
        return False
    return True


def device_spans(prof, cuda_type: object) -> list[tuple[int, int]]:
    """[start, end) in ns of every device work event a profiler saw (kernels, copies, memsets).

    Through the profiler's public event list (FunctionEvent: device_type, time_range in us); the raw kineto
    events' accessors differ between torch releases (torch 2.11 has no ``activity_type``).
    """
    spans = []
    for e in prof.events():
        if getattr(e, "device_type", None) != cuda_type:
            continue
        if not device_activity(getattr(e, "name", "kernel"), bool(getattr(e, "is_user_annotation", False))):
            continue
        tr = e.time_range
        spans.append((int(tr.start * 1000), int(tr.end * 1000)))
    return spans


def merged_busy_ns(intervals: Sequence[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) intervals (overlapping device work counted once)."""
    total, cur_start, cur_end = 0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _in_step_backward(prof, n: int, so_far: list[float] | None) -> list[float] | None:
    """``so_far`` plus this round's backward ms per call, read inside the steps (``backward_mark``); None once a
    round lacks a mark per call (a step without a backward, a reference that draws none) or an unlinked launch."""
    if so_far is None:
        return None
    try:
        events = list(prof.profiler.kineto_results.events())
    except AttributeError:  # a profiler without raw events: no direct figure
        return None
    got = backward_spans(events, lambda e: device_activity(e.name(), False))
    if got is None or got[0] != n:
        return None
    return [*so_far, merged_busy_ns(got[1]) / 1e6 / n]


def _host_timing(fn: Fn, budget: Budget, warm: bool = True) -> Timing:
    """Host wall clock per call, no synchronisation (host work alone when ``fn`` only plans)."""
    if warm:
        for _ in range(budget.warmup):
            fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, min(1000, int(budget.sample_ms * 1e-3 / one)))
    samples = max(budget.min_samples, min(budget.max_samples, int(budget.target_s / (one * inner))))
    per = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        per.append((time.perf_counter() - t0) * 1e3 / inner)
    return Timing.of(per, inner)


def _in_context(entry: Entry, fn: Callable[[], T]) -> T | Exception:
    """``fn()`` inside the entry's context, or the exception it raised: one implementation's failure is recorded on
    it by the caller while the others go on being timed."""
    try:
        with entry.context():
            return fn()
    except Exception as exc:
        return exc


class HostTimer:
    """The CPU smoke's clock: wall time per call; no kernels figure, no device memory."""

    kind = "host"

    def __init__(self, budget: Budget | None = None) -> None:
        self.budget = budget or Budget.quick()

    def e2e(self, calls: Sequence[Fn]) -> Timing:
        for fn in calls:
            fn()
        turn = [0]

        def rotate() -> None:
            calls[turn[0] % len(calls)]()
            turn[0] += 1

        return _host_timing(rotate, self.budget, warm=False)

    def e2e_host(self, calls: Sequence[Fn]) -> tuple[Timing, Timing | None]:
        return self.e2e(calls), None  # the end-to-end clock is the host's: no second figure

    def e2e_rounds(self, entries: dict[str, Entry]) -> Rounds:
        """One entry after the other (the CPU smoke claims no figures)."""
        return {label: _in_context(entry, lambda e=entry: self.e2e_host(e.calls)) for label, entry in entries.items()}

    def kernels(self, calls: Sequence[Fn]) -> Timing | None:
        return None

    def backward_kernels(self) -> Timing | None:
        return None

    def host(self, fn: Fn) -> Timing:
        return _host_timing(fn, self.budget)

    def peak_extra_bytes(self, fn: Fn) -> int | None:
        return None

    def describe(self) -> dict[str, object]:
        return {"clock": "host wall clock (time.perf_counter)", "budget": self.budget.__dict__}


class CudaTimer:
    """CUDA events for end to end, the profiler's device activity for kernels only, the allocator's peak."""

    kind = "cuda"

    def __init__(self, budget: Budget | None = None) -> None:
        import torch

        self.torch = torch
        self.budget = budget or Budget()
        self._cursor = 0
        self._backward: Timing | None = None

    def _sync(self) -> None:
        self.torch.cuda.synchronize()

    def _next_call(self, calls: Sequence[Fn]) -> None:
        """The next call in rotation (one cursor across batches: each sample starts where the last one stopped)."""
        calls[self._cursor % len(calls)]()
        self._cursor += 1

    def _batch(self, calls: Sequence[Fn], n: int) -> tuple[float, float]:
        """(per-call ms of n back-to-back calls between two events, the device idle at the start; per-call ms
        the host spent issuing them, from the first event's record to the last call's return)."""
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        self._sync()
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            self._next_call(calls)
        issued = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / n, issued * 1e3 / n

    def _warm(self, calls: Sequence[Fn]) -> None:
        for _ in range(self.budget.warmup):
            for fn in calls:
                fn()
        self._sync()

    def e2e(self, calls: Sequence[Fn]) -> Timing:
        return self.e2e_host(calls)[0]

    def e2e_host(self, calls: Sequence[Fn]) -> tuple[Timing, Timing | None]:
        """End to end, and the host's issue time of the same samples: a step whose issue time is close to its
        end-to-end time is host-bound (the device waited for the host), one well under it is device-bound."""
        got = self.e2e_rounds({"": Entry(calls)})[""]
        if isinstance(got, Exception):
            raise got
        return got

    def _plan(self, calls: Sequence[Fn]) -> tuple[int, int, bool]:
        """(calls per sample, samples, in a block) for calls whose one call takes what a first timed call takes;
        in a block: device-bound and at least ``e2e_block_ms`` long (see the module doc)."""
        self._warm(calls)
        one, issue = self._batch(calls, 1)
        one = max(one, 1e-4)
        inner = max(1, min(256, math.ceil(self.budget.sample_ms / one)))
        if inner > 1:
            inner = max(inner, len(calls))
        samples = max(self.budget.min_samples,
                      min(self.budget.max_samples, int(self.budget.target_s * 1e3 / (one * inner))))
        block = self.budget.e2e_block_ms is not None and one >= self.budget.e2e_block_ms and issue < 0.5 * one
        return inner, samples, block

    def e2e_rounds(self, entries: dict[str, Entry]) -> Rounds:
        out: Rounds = {}
        plans: dict[str, tuple[int, int, bool]] = {}
        for label, entry in entries.items():
            plan = _in_context(entry, lambda e=entry: self._plan(e.calls))
            if isinstance(plan, Exception):
                out[label] = plan
            else:
                plans[label] = plan
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label in plans}
        rounds = {label: plan for label, plan in plans.items() if not plan[2]}
        for r in range(max((n for _, n, _ in rounds.values()), default=0)):
            for label, (inner, samples, _) in rounds.items():
                if r >= samples or label in out:
                    continue
                got = _in_context(entries[label], lambda e=entries[label], n=inner: self._batch(e.calls, n))
                if isinstance(got, Exception):
                    out[label] = got
                else:
                    runs[label].append(got)
        for label, (inner, samples, block) in plans.items():
            if not block:
                continue
            got = _in_context(entries[label], lambda e=entries[label], n=inner, k=samples: self._block(e.calls, n, k))
            if isinstance(got, Exception):
                out[label] = got
            else:
                runs[label] = got
        for label, (inner, _, _) in plans.items():
            if label not in out:
                out[label] = (Timing.of([d for d, _ in runs[label]], inner),
                              Timing.of([h for _, h in runs[label]], inner))
        return out

    def _block(self, calls: Sequence[Fn], inner: int, samples: int) -> list[tuple[float, float]]:
        """A device-bound entry's samples one after another, after ``kernel_heat_ms`` of its own calls."""
        self._heat(calls)
        return [self._batch(calls, inner) for _ in range(samples)]

    def kernels(self, calls: Sequence[Fn]) -> Timing | None:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile

        n = max(len(calls), self.budget.kernel_calls)
        per: list[float] = []
        backward: list[float] | None = []
        for _ in range(self.budget.kernel_rounds):
            self._heat(calls)
            self._sync()
            with marking(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(n):
                    calls[i % len(calls)]()
                self._sync()
            busy = merged_busy_ns(device_spans(prof, DeviceType.CUDA))
            if busy <= 0:
                self._backward = None
                return None  # the profiler saw no device activity (CUPTI unavailable): no figure, never a guess
            per.append(busy / 1e6 / n)
            backward = _in_step_backward(prof, n, backward)
        self._backward = None if not backward else Timing.of(backward, n)
        return Timing.of(per, n)

    def backward_kernels(self) -> Timing | None:
        return self._backward

    def _heat(self, calls: Sequence[Fn]) -> None:
        """The calls back to back for ``Budget.kernel_heat_ms`` of host time (not timed; see the module doc)."""
        end = time.perf_counter() + self.budget.kernel_heat_ms / 1e3
        while time.perf_counter() < end:
            self._next_call(calls)

    def host(self, fn: Fn) -> Timing:
        timing = _host_timing(fn, self.budget)
        self._sync()
        return timing

    def peak_extra_bytes(self, fn: Fn) -> int | None:
        cuda = self.torch.cuda
        self._sync()
        cuda.reset_peak_memory_stats()
        base = cuda.memory_allocated()
        fn()
        self._sync()
        return int(cuda.max_memory_allocated() - base)

    def describe(self) -> dict[str, object]:
        return {"clock": "CUDA events (e2e), torch.profiler device activity (kernels)",
                "budget": self.budget.__dict__}
