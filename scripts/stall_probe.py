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

import argparse
import functools
import importlib
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from scripts.host_probe import rotate
from scripts.probe_cases import case_steps, log_to

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


def run(step: Callable[[], None], steps: int, drained: bool, acc: Accumulators) -> tuple[float, dict[str, float]]:
    """(host us per step, {function: us per step}) over ``steps`` steps, busy or drained."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    acc.reset()
    total = 0.0
    for _ in range(steps):
        if drained:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return total / steps * 1e6, {k: v / steps * 1e6 for k, v in acc.seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", default="manifests/h200.yaml")
    ap.add_argument("--op", action="append", default=[])
    ap.add_argument("--case", action="append", default=[], help="only cases whose id contains one of these")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--wrap", action="append", default=[], help="module:qualified.name (default: the fold path)")
    args = ap.parse_args()
    say = log_to(args.out, "stall_probe.txt")
    acc = Accumulators()
    for spec in args.wrap or DEFAULT_WRAPS:
        missing = install(spec, acc)
        if missing:
            say(f"not wrapped: {missing}")
    for found in case_steps(args.manifest, args.op, args.case, torch.device("cuda")):
        if isinstance(found, tuple):
            say(f"{found[0].id}: could not build: {found[1]!r}")
            continue
        for name, ref in found.refs:
            with ref.context():
                step = rotate(ref.calls)
                busy, busy_fns = run(step, args.steps, False, acc)
                drained, drained_fns = run(step, args.steps, True, acc)
            say(f"{found.case.id} {found.mode} [{name}]: host {busy:.0f} us per step busy, {drained:.0f} drained")
            names = sorted(set(busy_fns) | set(drained_fns),
                           key=lambda k: -(busy_fns.get(k, 0.0) - drained_fns.get(k, 0.0)))
            for k in names:
                b, d = busy_fns.get(k, 0.0), drained_fns.get(k, 0.0)
                say(f"    {k:58s} busy {b:8.1f} us  drained {d:8.1f} us  ({acc.calls.get(k, 0)} calls last run)")


if __name__ == "__main__":
    main()
