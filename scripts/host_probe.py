"""Where the host time of a bench step goes, on a GPU box: a diagnostic for issue 13 (not a benchmark).

For each bench case of the chosen ops in a manifest (the cases ``gradsweep bench`` times), every family's step
and the stock step are run back to back without synchronisation, as the bench's end-to-end clock does; it prints
the host time per step (and with the device drained), then a cProfile of one family's step (top functions by
own time). The fold-plan cases are timed the same way. The bench's figures are the signed ones: this only says
where a step's host time goes, to decide what to cut next.

    PYTHONPATH=. python3 scripts/host_probe.py OUT --op rms_norm --op qk_norm --profile cuda --profile triton

cProfile sees the calling thread only: a backward that the autograd engine runs on its device thread shows up
inside ``run_backward`` as one opaque entry, unless ``--backward-on-caller`` (the engine then runs backwards on
the calling thread while profiling: the Python backwards, fold planning included, show up by name).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import torch

from gradsweep.bench.catalog import fold_plan
from scripts.probe_cases import case_steps


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


def rotate(calls: list) -> Callable[[], None]:
    """One step of the bench's rotation over its data copies."""
    state = [0]

    def step() -> None:
        calls[state[0] % len(calls)]()
        state[0] += 1
    return step


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", default="manifests/h200.yaml")
    ap.add_argument("--op", action="append", default=[], help="ops whose bench cases are probed")
    ap.add_argument("--profile", action="append", default=[], help="families whose step is profiled")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--fold-plan", action="store_true", help="also the fold_plan cases")
    ap.add_argument("--case", action="append", default=[], help="only cases whose id contains one of these")
    ap.add_argument("--backward-on-caller", action="store_true",
                    help="profile with the autograd engine on the calling thread (Python backwards by name)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "host_probe.txt").open("a")

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    device = torch.device("cuda")
    if args.fold_plan:
        for case in fold_plan.cases(False):
            subject = fold_plan.PlanSubject(case, None, {}, device, 0)
            fn, calls = subject.host_step("host")
            h, d = host_us(fn, calls, args.steps)
            say(f"fold_plan {case.name}: host {h:.0f} us per call, drained {d:.0f} us")
    for found in case_steps(args.manifest, args.op, args.case, device):
        if isinstance(found, tuple):
            raise found[1]
        for name, ref in found.refs:
            step = rotate(ref.calls)
            with ref.context():
                h, d = host_us(step, 1, args.steps)
                say(f"{found.case.id} [{name}] {found.mode}: host {h:.0f} us per step, drained {d:.0f} us")
                if name in args.profile:
                    say(profile(step, max(args.steps // 2, 20), args.top, args.backward_on_caller))


if __name__ == "__main__":
    main()
