"""Where a host-bound bench step spends its host time (a diagnostic for issues 10, 12 and 13; not evidence).

For each named bench case (``gradsweep bench``'s catalog ids) and each implementation (stock, Triton, CUDA), the
step the bench times (``OpStep``: fresh folds, forward of every call, backwards) runs in a loop on the device:

- ``wall``: median over rounds of (N steps, then one synchronize) / N: what a step costs end to end;
- ``host``: the same loop's host time to *issue* the N steps (timer stopped before the synchronize);
- ``fwd``: the forward alone (``fwd_train``, the graph recorded, no backward), so ``wall - fwd`` is the backward;
- for both engine settings (``worker``: torch's device thread; ``caller``: the calling thread);
- then a cProfile of 200 steps (caller setting: cProfile sees only the thread that enables it), its top
  functions by own and by cumulative time, written to OUT/NAME.prof.txt.

``fold_plan/...`` cases time the catalog's planning step itself (no kernels; cold ones clear the plan caches each
step, uploads included).

Usage (on the GPU box): python3 scripts/host_profile.py OUT det_gemm/dx_m1 det_gemm/dw_t4096 rms_norm/bwd ...
"""

from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

from gradsweep.bench.catalog import catalog
from gradsweep.bench.catalog.fold_plan import PlanSubject
from gradsweep.bench.data import draw
from gradsweep.bench.runner import OpStep, packed_layout
from gradsweep.bench.suite import normalised
from gradsweep.ops.registry import get_op

ROUNDS, STEPS = 7, 50


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _loop(step, n: int) -> tuple[float, float]:
    """(host us, wall us) per step over n steps issued back to back."""
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    t1 = time.perf_counter()
    _sync()
    t2 = time.perf_counter()
    return (t1 - t0) / n * 1e6, (t2 - t0) / n * 1e6


def _measure(step) -> tuple[float, float]:
    for _ in range(3):
        _loop(step, 5)
    runs = [_loop(step, STEPS) for _ in range(ROUNDS)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def _profile(step, path: Path) -> str:
    prof = cProfile.Profile()
    _sync()
    prof.enable()
    for _ in range(200):
        step()
    _sync()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumtime").print_stats(30)
    path.write_text(out.getvalue())
    return out.getvalue()


def main(out: Path, ids: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    cases = {c.id: normalised(c) for c in catalog(False)}
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    lines = []
    for case_id in ids:
        case = cases[case_id]
        if case.runner == "fold_plan":  # host planning alone: the catalog's own step (cold: caches cleared)
            subject = PlanSubject(case, None, {}, device, 7)
            host, wall = _measure(subject._step)
            _profile(subject._step, out / f"{case_id.replace('/', '_')}.prof.txt")
            lines.append(f"{case_id} | host | host {host:.1f} wall {wall:.1f}")
            print(lines[-1], flush=True)
            continue
        op = get_op(case.op)
        data = draw(op, case.shape, case.tokens, device, 7)
        layout = packed_layout(case.lengths)
        for impl in (f"torch.{op.name}", f"triton.{op.name}", f"cuda.{op.name}"):
            cand = op.candidates.get(impl)
            if cand is None:
                continue
            try:
                steps = {mode: OpStep(op, cand, data, case.shape, case.lengths, layout, mode, case.grads)
                         for mode in ("fwd_train", "fwd_bwd")} if case.phase != "fwd" else \
                    {"fwd": OpStep(op, cand, data, case.shape, case.lengths, layout, "fwd", case.grads)}
                row = [case_id, impl]
                for thread in ("worker", "caller"):
                    with torch.autograd.set_multithreading_enabled(thread == "worker"):
                        for mode, step in steps.items():
                            host, wall = _measure(step)
                            row.append(f"{thread} {mode} host {host:.1f} wall {wall:.1f}")
                name = f"{case_id.replace('/', '_')}-{impl}"
                with torch.autograd.set_multithreading_enabled(False):  # cProfile sees its own thread only
                    _profile(steps.get("fwd_bwd") or steps["fwd"], out / f"{name}.prof.txt")
                lines.append(" | ".join(row))
            except Exception as exc:  # a diagnostic: say it and go on
                lines.append(f"{case_id} | {impl} | error {type(exc).__name__}: {exc}")
            print(lines[-1], flush=True)
    (out / "host_profile.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
