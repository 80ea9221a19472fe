"""Where the host time of a bench step goes, on a GPU box: a diagnostic for issue 13 (not a benchmark).

For each bench case of the chosen ops in a manifest (the cases ``gradsweep bench`` times), every family's step
and the stock step are run back to back without synchronisation, as the bench's end-to-end clock does; it prints
the host time per step (and with the device drained), then a cProfile of one family's step (top functions by
own time). The fold-plan cases are timed the same way. The bench's figures are the signed ones: this only says
where a step's host time goes, to decide what to cut next.

    PYTHONPATH=. python3 scripts/host_probe.py OUT --op rms_norm --op qk_norm --profile cuda --profile triton

``--audit`` times each step with the bench's own end-to-end clock (``CudaTimer.e2e_rounds``: samples of
back-to-back calls between two events, every side in turn) and prints, per side, the host issue time and the
end-to-end time per call, what the caching allocators did during the samples (device blocks allocated / freed,
allocation retries: a ``cudaFree`` waits for the device; pinned host blocks allocated), and each distinct
synchronising call that torch's sync-debug mode reports with the Python frames that made it: a step whose issue
time is near host + device rather than max(host, device) waits for the device somewhere, and this says where.

``--fold-plan-audit`` gives each fold_plan case the audit's view (allocator events per step, synchronising calls)
and a cProfile, before anything else runs: `h200_closeout.sh --host-audit` runs it as
`host_probe.py OUT --op fold_plan --fold-plan-audit` (fold_plan's cases are host-only, so no op step follows).

Every fold-plan block also prints which planner ran (compiled ``gradsweep._fold_plan`` or numpy) and the host's
speed at that moment (the bench's own Python-loop ceiling, ``ceilings._python_loop``), since the lent host's speed
moves ~2x within one device call; with ops given, the fold-plan cases run again after them, in the same process
(after, say, a linear_logp step at T = 16384: a large allocator pool and Python heap).

cProfile sees the calling thread only: a backward that the autograd engine runs on its device thread shows up
inside ``run_backward`` as one opaque entry, unless ``--backward-on-caller`` (the engine then runs backwards on
the calling thread while profiling: the Python backwards, fold planning included, show up by name).
"""

from __future__ import annotations

import collections
import contextlib
import cProfile
import io
import pstats
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from gradsweep import canonical
from gradsweep.bench.catalog import fold_plan
from gradsweep.bench.ceilings import PYTHON_LOOP, _python_loop
from gradsweep.bench.timing import CudaTimer, Entry, HostTimer
from scripts.probe_cases import case_steps, log_to, probe_parser


def host_us(step: Callable[[], object], calls: int, n: int) -> tuple[float, float]:
    """(host us per call, us per call once the device has drained) over n steps."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    host = (time.perf_counter() - t0) / n / calls * 1e6
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) / n / calls * 1e6


def python_loop_us() -> float:
    """The bench's Python-loop ceiling at this moment, timed by the bench's own host clock (us per loop)."""
    return HostTimer().host(_python_loop).median_ms * 1e3


def fold_plan_block(say: Callable[[str], None], device: torch.device, steps: int, when: str,
                    audit_top: int | None = None) -> None:
    """The fold_plan cases' host time per call, with the planner that ran and the host's speed around them.

    ``audit_top`` (``--fold-plan-audit``): also where each case's host time goes on this host: the allocators'
    events per step (pinned host blocks and device blocks allocated or freed: a caching allocator that cannot reuse
    a block pays the driver), the synchronising calls of one step with the frames that made them, and a cProfile
    of the steps (its top functions). Why: the CPU box plans a chunked call in ~33 us with the staging copies
    stubbed, the lent H100 host paid ~290 us a call, and only the GPU host can say which CUDA host call takes the
    rest."""
    planner = "compiled (gradsweep._fold_plan)" if canonical._native_plan is not None else "numpy"
    say(f"fold_plan, {when}: planner {planner}; Python loop ({PYTHON_LOOP} iterations) {python_loop_us():.1f} us")
    for case, family in ((c, f) for c in fold_plan.cases(False) for f in fold_plan.FAMILIES):
        subject = fold_plan.PlanSubject(case, None, {}, device, 0)
        try:
            fn, calls = subject.host_step(family)
            fn()
        except Exception as exc:  # this family's kernels cannot run here (no CUDA extension built, say)
            say(f"fold_plan {case.name} [{family}]: not run ({type(exc).__name__}: {exc})")
            continue
        if audit_top is None:
            h, d = host_us(fn, calls, steps)
            say(f"fold_plan {case.name} [{family}]: host {h:.0f} us per call, drained {d:.0f} us")
            continue
        fn()  # the first step's allocations are not a step's
        torch.cuda.synchronize()
        before = _alloc_counts()
        h, d = host_us(fn, calls, steps)
        after = _alloc_counts()
        events = {k: round((after[k] - before[k]) / (steps + 5), 2) for k in after if after[k] != before[k]}
        say(f"fold_plan {case.name} [{family}]: host {h:.0f} us per call, drained {d:.0f} us; allocator events per "
            f"step {events or 'none'}")
        for site in _sync_sites(fn):
            say(f"    sync: {site}")
        say(profile(fn, max(steps // 2, 20), audit_top))
    say(f"fold_plan, {when}: Python loop after {python_loop_us():.1f} us")


def profile(step: Callable[[], object], n: int, top: int, on_caller: bool = False) -> str:
    prof = cProfile.Profile()
    # on_caller: backwards on this thread (the autograd engine's device threads are invisible to cProfile); the
    # engine's setting before is restored on the way out
    with torch.autograd.set_multithreading_enabled(not on_caller):
        prof.enable()
        for _ in range(n):
            step()
        prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


_ALLOC_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")


def _alloc_counts() -> dict[str, int]:
    dev = torch.cuda.memory_stats()
    out = {k: int(dev.get(k, 0)) for k in _ALLOC_KEYS}
    host = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    out["num_host_alloc"] = int(host.get("num_host_alloc", 0))
    return out


def _sync_sites(step: Callable[[], object]) -> list[str]:
    """Distinct synchronising calls of one step (torch's sync-debug warnings) with the Python frames that made
    them (gradsweep / bench frames only)."""
    import traceback
    import warnings

    seen: dict[str, int] = {}
    old = warnings.showwarning

    def hook(message, category, filename, lineno, file=None, line=None):
        if "prototype feature" in str(message):  # the mode's own notice, not a sync
            return
        frames = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]
                  if "gradsweep" in f.filename or "scripts" in f.filename]
        key = f"{str(message)[:80]} <- " + " < ".join(reversed(frames[-6:]))
        seen[key] = seen.get(key, 0) + 1

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with torch.autograd.set_multithreading_enabled(False):  # backwards on this thread: their frames show
                step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = old
    torch.cuda.synchronize()
    return [f"{n}x {k}" for k, n in seen.items()]


def audit(refs: list) -> list[str]:
    """Every side timed by the bench's own end-to-end clock (``CudaTimer.e2e_rounds``: its warm-up, sample sizes
    and round robin): per side the median issue and end-to-end ms per call, the allocators' counts summed over
    the side's batches (taken in the context the timer enters around each batch, outside its timed region: the
    warm-up's included), then each side's synchronising calls."""
    counts: dict[str, collections.Counter] = {name: collections.Counter() for name, _ in refs}

    def counted(name: str, ref) -> Callable[[], contextlib.AbstractContextManager]:
        @contextlib.contextmanager
        def context() -> Iterator[None]:
            with ref.context():
                before = _alloc_counts()
                try:
                    yield
                finally:
                    after = _alloc_counts()
                    counts[name].update({k: after[k] - before[k] for k in after})
        return context

    got = CudaTimer().e2e_rounds({name: Entry(ref.calls, counted(name, ref)) for name, ref in refs})
    lines = []
    for name, ref in refs:
        result = got[name]
        if isinstance(result, Exception):
            lines.append(f"  [{name}] failed: {result!r}")
            continue
        e2e, issue = result
        lines.append(f"  [{name}] issue {issue.median_ms:.3f} ms, e2e {e2e.median_ms:.3f} ms per call over "
                     f"{e2e.samples} x {e2e.calls_per_sample} calls; allocators: {dict(counts[name])}")
        with ref.context():
            for site in _sync_sites(rotate(ref.calls)):
                lines.append(f"    sync: {site}")
    return lines


def rotate(calls: list) -> Callable[[], None]:
    """One step of the bench's rotation over its data copies."""
    state = [0]

    def step() -> None:
        calls[state[0] % len(calls)]()
        state[0] += 1
    return step


def main() -> None:
    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--profile", action="append", default=[], help="families whose step is profiled")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--fold-plan", action="store_true", help="also the fold_plan cases")
    ap.add_argument("--fold-plan-audit", action="store_true",
                    help="the fold_plan cases' allocator events, synchronising calls and cProfile (run first)")
    ap.add_argument("--audit", action="store_true",
                    help="bench-like samples of every side in turn: issue vs device time, allocator counts, syncs")
    ap.add_argument("--backward-on-caller", action="store_true",
                    help="profile with the autograd engine on the calling thread (Python backwards by name)")
    args = ap.parse_args()
    say = log_to(args.out, "host_probe.txt")

    device = torch.device("cuda")
    if args.fold_plan_audit:
        fold_plan_block(say, device, args.steps, "audit", audit_top=args.top)
    if args.fold_plan:
        fold_plan_block(say, device, args.steps, "first")
    ran_ops = False
    for found in case_steps(args.manifest, args.op, args.case, device):
        if isinstance(found, tuple):
            raise found[1]
        if args.audit:
            say(f"{found.case.id} {found.mode} audit:")
            for line in audit(found.refs):
                say(line)
            continue
        for name, ref in found.refs:
            step = rotate(ref.calls)
            with ref.context():
                h, d = host_us(step, 1, args.steps)
                say(f"{found.case.id} [{name}] {found.mode}: host {h:.0f} us per step, drained {d:.0f} us")
                if name in args.profile:
                    say(profile(step, max(args.steps // 2, 20), args.top, args.backward_on_caller))
        ran_ops = True
    if args.fold_plan and ran_ops:
        fold_plan_block(say, device, args.steps, "after the op steps, same process")


if __name__ == "__main__":
    main()
