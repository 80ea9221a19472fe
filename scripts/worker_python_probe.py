"""Why a Python ``autograd.Function`` backward costs more on torch's device thread (a diagnostic for issue 13).

The bench's host profiles (bench/results/triton_swap_2026-12-04/host_profile/) show our per-op backwards losing
~300 us a step on the autograd engine's device thread where torch's C++ nodes lose ~110 us (the hand-off). Two
explanations predict different things:

- the Python runs slower there (another core, cold caches, a slower or shared core): then inside the backward
  the thread's CPU time grows with its wall time, and pure-Python work is slower there too;
- the thread waits (for the GIL, a lock, a wake-up): then the backward's wall time exceeds its CPU time.

For a ladder of backwards (identity; N iterations of pure Python; N torch ops on a small CUDA tensor), each run
on both engine settings, this prints per backward
call: the step's wall time, and inside ``backward`` its wall time and ``time.thread_time()`` (the thread's CPU
time), medians over ROUNDS x STEPS, plus the CPU each thread ran on (glibc's ``sched_getcpu``). A last pass runs
the ladder on the device thread with it and the main thread pinned to one CPU: if the Python only ran slower
there for being on another core, the pinned pass reads like the calling thread's.

Usage (on the GPU box): python3 scripts/worker_python_probe.py [OUT.txt]
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

ROUNDS, STEPS = 5, 200
_inside: list[tuple[float, float]] = []
_cpus: set[int] = set()
_PIN: set[int] = set()  # when set: every thread that runs a backward is pinned to these CPUs (the last pass)


def _libc_getcpu():
    try:
        import ctypes

        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return lambda: -1


_GETCPU = _libc_getcpu()


def _cpu() -> int:
    """The CPU the calling thread runs on now (glibc's sched_getcpu; -1 where it is missing)."""
    return int(_GETCPU())


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _python_work(n: int) -> int:
    acc, d = 0, {"k": 1}
    for i in range(n):
        acc += d["k"] + (i & 3)
    return acc


def _make(body):
    class Fn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            return x.clone()

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            if _PIN and os.sched_getaffinity(0) != _PIN:
                os.sched_setaffinity(0, _PIN)  # this thread only (Linux: 0 is the calling thread)
            w0, c0 = time.perf_counter(), time.thread_time()
            out = body(dy)
            _inside.append((time.perf_counter() - w0, time.thread_time() - c0))
            _cpus.add(_cpu())
            return out

    return Fn


def _ladder() -> dict:
    small = lambda dy: dy  # noqa: E731
    bodies = {"identity": small}
    for n in (100, 1000):
        bodies[f"python x{n}"] = lambda dy, n=n: (_python_work(n), dy)[1]
    for n in (5, 20):
        def ops(dy, n=n):
            for _ in range(n):
                dy = dy.add(0)
            return dy
        bodies[f"torch ops x{n}"] = ops
    return bodies


def _time(fn, x, dy) -> tuple[float, float, float]:
    walls = []
    _inside.clear()
    for _ in range(ROUNDS):
        _sync()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            y = fn.apply(x)
            y.backward(dy)
        _sync()
        walls.append((time.perf_counter() - t0) / STEPS * 1e6)
    inner_wall = statistics.median(w for w, _ in _inside) * 1e6
    inner_cpu = statistics.median(c for _, c in _inside) * 1e6
    return statistics.median(walls), inner_wall, inner_cpu


def main(out: str | None) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on a CPU every backward runs on the caller
    x = torch.randn(64, 64, device=device, requires_grad=True)
    dy = torch.randn(64, 64, device=device)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else "?"
    lines = [f"device {device}; main thread cpu {_cpu()}; affinity {affinity}"]
    lines.append(f"{'backward':22} {'engine':7} {'step us':>9} {'bwd wall':>9} {'bwd cpu':>9}  cpus")
    passes = [(name, body, thread) for name, body in _ladder().items() for thread in ("worker", "caller")]
    # last: the worker thread pinned to the CPU the main thread is on (main pinned too): if the Python runs
    # slower on the device thread because it runs on another core (cold caches), this pass recovers it
    passes += [(f"{name} pinned", body, "worker") for name, body in _ladder().items() if name != "identity"]
    for name, body, thread in passes:
        if name.endswith("pinned") and not _PIN and hasattr(os, "sched_setaffinity"):
            _PIN.add(max(_cpu(), 0))
            os.sched_setaffinity(0, _PIN)
        fn = _make(body)
        _cpus.clear()
        with torch.autograd.set_multithreading_enabled(thread == "worker"):
            for _ in range(20):
                fn.apply(x).backward(dy)
            step, wall, cpu = _time(fn, x, dy)
        lines.append(f"{name:22} {thread:7} {step:9.1f} {wall:9.1f} {cpu:9.1f}  {sorted(_cpus)}")
        print(lines[-1], flush=True)
    if out:
        with open(out, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
