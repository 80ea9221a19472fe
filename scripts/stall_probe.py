"""Where a bench step's host waits for the device, on a GPU box: a diagnostic (not a benchmark).

A host-bound step whose issue time is near host + device rather than max(host, device) waits for the device
somewhere (the Triton dW step at T = 4096 issued at ~700 us a step against ~470 us of kernels on the H200, while
its Python host path is ~80 us on the 2-core CPU box: bench/results/launch_memo_2026-12-04/). torch's sync-debug
mode sees the syncs torch makes; a stall in the caching allocators, a driver call or a pinned copy it does not.

Each function named in ``--wrap`` (module:qualified.name; defaults: the fold's planning and upload, the dW fold,
the Triton launch paths, torch.empty and the autograd entry) is wrapped with a wall-clock accumulator. Every
selected bench case's family and stock steps then run twice, ``--steps`` steps each: **busy** (back to back, as
the bench's end-to-end clock runs them: the device has queued work) and **drained** (the device synchronised
before every step). Printed per side: us per step in each wrapped function in both conditions, largest busy -
drained difference first. A function that costs much more while the device is busy waits for it.

    PYTHONPATH=. python3 scripts/stall_probe.py OUT --op det_gemm --case dw_t4096 --op rms_norm --case bwd
"""

from __future__ import annotations

import functools
import importlib
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from scripts.host_probe import rotate
from scripts.probe_cases import back_to_back, case_steps, log_to, probe_parser

DEFAULT_WRAPS = (
    "gradsweep.canonical:CanonicalFold.take_tiles",
    "gradsweep.canonical:CanonicalFold.finish",
    "gradsweep.uploads:upload",
    "gradsweep.triton_kernels.gemm:dw_fold_tiles",
    "gradsweep.triton_kernels.gemm:matmul_invariant",
    "gradsweep.triton_kernels._launch:FastLaunch.__call__",
    "gradsweep.triton_kernels._launch:FastLaunch.memo",
    "gradsweep.triton_kernels._common:Tuner.__call__",
    "torch:empty",
    "torch:zeros",
    "torch.autograd:backward",
)


class Accumulators:
    """Wall time and calls per wrapped function; ``depth`` keeps nested wrapped calls from counting twice in the
    step total (each function's own figure includes what it calls)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1
        return timed


def install(spec: str, acc: Accumulators) -> str | None:
    """Wrap ``module:Qual.name`` in place; the reason when it cannot be found (the probe goes on without it)."""
    module_name, _, qual = spec.partition(":")
    try:
        owner = importlib.import_module(module_name)
        *path, attr = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        fn = getattr(owner, attr)
    except (ImportError, AttributeError) as exc:
        return f"{spec}: {exc}"
    setattr(owner, attr, acc.wrap(spec, fn))
    return None


def run(step: Callable[[], None], steps: int, drained: bool, acc: Accumulators,
        lead_cycles: int = 0) -> tuple[float, dict[str, float]]:
    """(host us per step, {function: us per step}) over ``steps`` steps, busy or drained. ``lead_cycles``: after
    each drain, a ``torch.cuda._sleep`` of that many cycles is queued first, so the device is still busy while the
    step's host code runs (in a host-bound step the device is idle when the host gets to a wait, and busy vs
    drained cannot see it; with a lead, a function that waits for the device grows by what is left of the lead)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    acc.reset()
    total = 0.0
    for _ in range(steps):
        if drained or lead_cycles:
            torch.cuda.synchronize()
        if lead_cycles:
            torch.cuda._sleep(lead_cycles)
        t0 = time.perf_counter()
        step()
        total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return total / steps * 1e6, {k: v / steps * 1e6 for k, v in acc.seconds.items()}


def host_percentiles(step: Callable[[], None], seconds: float) -> str:
    """Host time per step over ``seconds`` of steps issued back to back (as the bench's end-to-end clock runs them),
    against the device time of the same steps (one event pair per 20 steps): percentiles show a periodic cost a
    100-step run misses; device time per step well above the host's says the two do not overlap."""
    host: list[float] = []
    device = back_to_back(step, seconds, host)
    host.sort()
    q = [host[int(f * (len(host) - 1))] * 1e6 for f in (0.1, 0.5, 0.9, 0.99)]
    return (f"    back to back {seconds:.0f} s, {len(host)} steps: host us per step p10 {q[0]:.0f} p50 {q[1]:.0f} "
            f"p90 {q[2]:.0f} p99 {q[3]:.0f} max {host[-1] * 1e6:.0f} mean {statistics.mean(host) * 1e6:.0f}; "
            f"device (events) per step median {statistics.median(device):.0f} us")


def main() -> None:
    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--wrap", action="append", default=[],
                    help="module:qualified.name (default: the fold path; none: nothing wrapped)")
    ap.add_argument("--lead-us", type=float, default=0.0,
                    help="also a run with this much device work queued before each (drained) step")
    ap.add_argument("--back-to-back", type=float, default=0.0, help="also seconds of back-to-back steps")
    ap.add_argument("--caller-backward", action="store_true",
                    help="also every run again with the autograd engine on the calling thread")
    args = ap.parse_args()
    say = log_to(args.out, "stall_probe.txt")
    acc = Accumulators()
    say(f"python threads at start: {[t.name for t in threading.enumerate()]}")
    for spec in [] if args.wrap == ["none"] else args.wrap or DEFAULT_WRAPS:
        missing = install(spec, acc)
        if missing:
            say(f"not wrapped: {missing}")
    for found in case_steps(args.manifest, args.op, args.case, torch.device("cuda")):
        if isinstance(found, tuple):
            say(f"{found[0].id}: could not build: {found[1]!r}")
            continue
        for name, ref in found.refs:
            for caller in (False, True) if args.caller_backward else (False,):
                tag = f"{name}, backward on the caller" if caller else name
                with torch.autograd.set_multithreading_enabled(not caller), ref.context():
                    step = rotate(ref.calls)
                    conditions = [("busy", run(step, args.steps, False, acc)),
                                  ("drained", run(step, args.steps, True, acc))]
                    if args.lead_us:
                        cycles = int(args.lead_us * clock_mhz())
                        conditions.append((f"lead {args.lead_us:.0f} us", run(step, args.steps, True, acc, cycles)))
                    b2b = host_percentiles(step, args.back_to_back) if args.back_to_back else None
                report(say, f"{found.case.id} {found.mode} [{tag}]", conditions, acc)
                if b2b:
                    say(b2b)


def clock_mhz() -> float:
    """The SM clock the lead's cycles are counted in (the device's maximum; a slower clock lengthens the lead)."""
    khz = getattr(torch.cuda.get_device_properties(0), "clock_rate", 0)  # not in every torch
    return khz / 1e3 if khz else 1980.0


def report(say: Callable[[str], None], title: str, conditions: list, acc: Accumulators) -> None:
    """One line per condition's step time, then each wrapped function in every condition, the largest difference
    between the last condition and drained first."""
    say(f"{title}: host us per step " + ", ".join(f"{c} {t:.0f}" for c, (t, _) in conditions))
    fns = [f for _, (_, f) in conditions]
    last, drained = fns[-1], fns[1]
    for k in sorted(set().union(*fns), key=lambda k: -(last.get(k, 0.0) - drained.get(k, 0.0))):
        cells = "  ".join(f"{c} {f.get(k, 0.0):8.1f}" for (c, _), f in zip(conditions, fns))
        say(f"    {k:58s} {cells} us  ({acc.calls.get(k, 0)} calls last run)")


if __name__ == "__main__":
    main()
