"""Where a bench step's backward time goes on torch's autograd device thread, against the calling thread (issue 13).

The signed det_gemm runs of 2026-12-04 read the Triton dW step at T = 4096 host-bound on the engine's device
thread (host / e2e 1.09x, e2e 1.95x cuBLAS) and not on the calling thread (0.52x, 1.17x); the synthetic ladder of
scripts/worker_python_probe.py put the device thread's cost at a ~40-75 us hand-off per backward, less than half
that gap. This probe splits the real steps' backward, per side and engine setting, into:

- ``in``: from ``torch.autograd.backward`` being called to the first Python backward starting (the engine's
  start and, on the device thread, the wake-up and GIL hand-off);
- ``body``: the Python backwards themselves (wall time), with ``cpu`` their thread's CPU time (a body whose wall
  time exceeds its CPU time waited inside: for the GIL, a lock, an allocator, the driver);
- ``out``: from the last Python backward returning to ``backward`` returning (the engine's end and the hand-off
  back);
- the step's host time (forward and backward issued, device not drained), medians over the steps,

and prints a cProfile of the bodies on whichever thread ran them (a per-thread profiler is switched on inside
each Python backward, so the device thread's Python shows up by name, as ``--backward-on-caller`` of
scripts/host_probe.py shows it only for the calling thread). Stock steps (C++ nodes only) get the step and
``backward``'s own time. Nothing here is a benchmark: the signed bench's figures are the ones that count.

    PYTHONPATH=. python3 scripts/backward_thread_probe.py OUT --op det_gemm --case dw_t4096 --op rms_norm --case bwd
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.autograd.function import BackwardCFunction


@dataclass
class Trace:
    """What the wrapped entry points saw: ``backward`` calls as (start, end) and Python backward bodies as
    (thread id, start, end, cpu seconds), on one clock (``time.perf_counter``); per-thread profilers of the
    bodies when ``profile`` is set."""

    profile: bool = False
    calls: list[tuple[float, float]] = field(default_factory=list)
    bodies: list[tuple[int, float, float, float]] = field(default_factory=list)
    profilers: dict[int, cProfile.Profile] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        self.calls.clear()
        self.bodies.clear()


@contextlib.contextmanager
def traced(trace: Trace) -> Iterator[Trace]:
    """Wrap ``torch.autograd.backward`` and the Python backward entry (``BackwardCFunction.apply``, what the engine
    calls for every ``autograd.Function`` node, on whichever thread runs it) for the duration."""
    apply, backward = BackwardCFunction.apply, torch.autograd.backward

    def traced_apply(self, *args):
        tid = threading.get_ident()
        prof = None
        if trace.profile:
            with trace.lock:
                prof = trace.profilers.setdefault(tid, cProfile.Profile())
        c0, t0 = time.thread_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        try:
            return apply(self, *args)
        finally:
            if prof is not None:
                prof.disable()
            t1, c1 = time.perf_counter(), time.thread_time()
            with trace.lock:
                trace.bodies.append((tid, t0, t1, c1 - c0))

    def traced_backward(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return backward(*args, **kwargs)
        finally:
            trace.calls.append((t0, time.perf_counter()))

    BackwardCFunction.apply, torch.autograd.backward = traced_apply, traced_backward
    try:
        yield trace
    finally:
        BackwardCFunction.apply, torch.autograd.backward = apply, backward


@dataclass(frozen=True)
class Split:
    """Medians over the steps, in us: per ``backward`` call (``in``, ``body``, ``cpu``, ``out``, ``total``)."""

    total: float
    hand_in: float | None
    body: float | None
    cpu: float | None
    hand_out: float | None
    on_caller: bool | None  # whether the bodies ran on the thread that called backward (None: no Python body)


def split(trace: Trace, caller: int) -> Split:
    """Each ``backward`` call's time cut at its first body's start and its last body's end (bodies assigned to the
    call whose span holds them)."""
    totals, ins, bods, cpus, outs, threads = [], [], [], [], [], set()
    for t0, t1 in trace.calls:
        inside = [b for b in trace.bodies if t0 <= b[1] and b[2] <= t1]
        totals.append((t1 - t0) * 1e6)
        if inside:
            ins.append((min(b[1] for b in inside) - t0) * 1e6)
            outs.append((t1 - max(b[2] for b in inside)) * 1e6)
            bods.append(sum(b[2] - b[1] for b in inside) * 1e6)
            cpus.append(sum(b[3] for b in inside) * 1e6)
            threads.update(b[0] for b in inside)

    def med(xs: list[float]) -> float | None:
        return statistics.median(xs) if xs else None

    return Split(med(totals) or 0.0, med(ins), med(bods), med(cpus), med(outs),
                 (threads == {caller}) if threads else None)


def fmt(s: Split) -> str:
    def us(x: float | None) -> str:
        return "   -" if x is None else f"{x:6.1f}"
    where = {None: "no Python backward", True: "bodies on the caller", False: "bodies on the device thread"}
    return (f"backward {us(s.total)} = in {us(s.hand_in)} + body {us(s.body)} (cpu {us(s.cpu)}) + out "
            f"{us(s.hand_out)} us; {where[s.on_caller]}")


def measure(step: Callable[[], None], steps: int, worker: bool, profile: bool,
            sync: Callable[[], None]) -> tuple[float, Split, Trace]:
    """Host us per step (issued back to back, drained at the end) and the backward split, on one engine setting."""
    trace = Trace()  # the warm-up (compiles, plans, allocations) is neither profiled nor counted
    with torch.autograd.set_multithreading_enabled(worker), traced(trace):
        for _ in range(10):
            step()
        sync()
        trace.clear()
        trace.profile = profile
        host = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            host.append((time.perf_counter() - t0) * 1e6)
        sync()
    return statistics.median(host), split(trace, threading.get_ident()), trace


def profile_text(trace: Trace, top: int) -> str:
    out = io.StringIO()
    for tid, prof in trace.profilers.items():
        role = "calling thread" if tid == threading.get_ident() else f"thread {tid}"
        out.write(f"--- Python backwards on the {role}, by own time\n")
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    from scripts.host_probe import rotate
    from scripts.probe_cases import log_to, probe_parser, training_steps

    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--profile", action="append", default=[], help="sides whose bodies are profiled (families)")
    args = ap.parse_args()
    say = log_to(args.out, "backward_thread_probe.txt")
    device = torch.device("cuda")
    for found in training_steps(args.manifest, args.op, args.case, device, say):
        for name, ref in found.refs:
            step = rotate(ref.calls)
            with ref.context():
                for worker in (True, False):
                    thread = "worker" if worker else "caller"
                    host, s, trace = measure(step, args.steps, worker, name in args.profile, torch.cuda.synchronize)
                    say(f"{found.case.id} [{name}] {thread}: step host {host:6.1f} us; {fmt(s)}")
                    if name in args.profile and worker:
                        say(profile_text(trace, args.top))


if __name__ == "__main__":
    main()
