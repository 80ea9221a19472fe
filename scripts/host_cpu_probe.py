"""The Python host path of the Triton family's bench steps, on a CPU box: a host trim measured before device time.

Each selected bench case is built as ``gradsweep bench`` builds it (the op's declaration, the case's token lengths
in one packed call, fresh folds over persistent main grads), at narrow widths (every shape size above 64 becomes
64: the host work of a step follows its rows, tiles and calls, not its width), on CPU tensors, with the kernels
stubbed: ``FastLaunch`` launches nothing (each launch is counted) and a ``Tuner`` takes its first configuration.
The GPU's code paths run (no ``TRITON_INTERPRET``); ``--fake-tma`` also takes the Hopper TMA routes of the dW fold
and linear_logp, as on the H200. Printed per case: us per step of each mode the bench times (best of rounds), the
backward as the bench derives it (fwd_bwd - fwd_train), launches per step; ``--profile`` adds a cProfile of the
training step (autograd on the calling thread).

torch ops that run on the device there run on the CPU here (the embedding backward's token sort: ~0.8 ms of the
CPU's own sorting), so a step dominated by them says nothing about its host path; the profile shows which.
A launch that bypasses ``FastLaunch`` needs a driver: that case is reported as not probed. Not in the figure: the
launches themselves (Triton's C launcher, ``FastLaunch``'s key: ~15 us each on the lent
H200 hosts, bench/results/host_layers_h200_2026-12-02/), CUDA allocations and uploads. The lent H200 hosts ran
this Python ~5x slower than the 2-core CPU box (the cold fold plan: ~31 us here, 172-176 us there), so compare
before / after on one box; the signed bench is the figure that counts.

    .venv/bin/python scripts/host_cpu_probe.py --op rms_norm --op det_gemm --case dw_t4096 --fake-tma
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gradsweep.bench.cases import MEASURED, Case
from gradsweep.bench.catalog import catalog
from gradsweep.bench.data import draw
from gradsweep.bench.runner import OpStep, packed_layout
from gradsweep.ops.registry import get_op
from gradsweep.triton_kernels import _common, _launch, gemm, linear_logp

NARROW = 64


class Stubs:
    """The kernels stubbed out for the process (launches counted); ``fake_tma``: the TMA routes taken."""

    def __init__(self, fake_tma: bool) -> None:
        self.launches = 0

        def launch(_fl, *_args, **_kw) -> None:
            self.launches += 1
        def memo(fl, key, build) -> None:  # a memoised launch: its arguments built the first time the key comes
            self.launches += 1
            if key not in fl._memo:
                build()
                fl._memo[key] = True
        def replay_all(fl, keys) -> bool:  # memoised launches replayed, all or none (as FastLaunch.replay_all)
            if not all(key in fl._memo for key in keys):
                return False
            self.launches += len(keys)
            return True
        _launch.FastLaunch.__call__ = launch  # type: ignore[method-assign]
        _launch.FastLaunch.memo = memo  # type: ignore[method-assign]
        _launch.FastLaunch.replay_all = replay_all  # type: ignore[method-assign]
        _common.Tuner._tune = lambda tuner, key, *a, **k: tuner.configs(key)[0]  # type: ignore[method-assign]
        if fake_tma:
            gemm.tma_rows_ok = lambda *tensors: True
            linear_logp.tma_rows_ok = lambda *tensors: True


def narrow(shape: dict) -> dict:
    """The case's shape with every int size above NARROW made NARROW (floats, flags and small sizes kept)."""
    return {k: NARROW if isinstance(v, int) and not isinstance(v, bool) and v > NARROW else v
            for k, v in shape.items()}


def best_us(step: Callable[[], None], rounds: int, n: int) -> float:
    for _ in range(3):
        step()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def probe(case: Case, stubs: Stubs, rounds: int, n: int, profile_top: int, sort: str = "tottime") -> list[str]:
    op = get_op(case.op)
    cand = op.candidates.get(f"triton.{case.op}")
    if cand is None:
        return [f"{case.id}: no Triton candidate"]
    shape = op.shape_model(**narrow(case.shape)).model_dump()
    data = draw(op, shape, case.tokens, torch.device("cpu"), 0)
    lines, figures = [], {}
    for mode in MEASURED[case.phase]:
        step = OpStep(op, cand, data, shape, case.lengths, packed_layout(case.lengths), mode, case.grads)
        before = stubs.launches
        step()
        launches = stubs.launches - before
        figures[mode] = best_us(step, rounds, n)
        lines.append(f"{case.id} {mode}: {figures[mode]:.1f} us per step, {launches} launches")
        if profile_top and mode == MEASURED[case.phase][-1]:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(n):
                step()
            prof.disable()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats(sort).print_stats(profile_top)
            lines.append(buf.getvalue())
    if case.phase == "bwd":
        lines.append(f"{case.id} bwd (fwd_bwd - fwd_train): {figures['fwd_bwd'] - figures['fwd_train']:.1f} us")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", action="append", default=[], help="ops whose bench cases are probed (default: all)")
    ap.add_argument("--case", action="append", default=[], help="only cases whose id contains one of these")
    ap.add_argument("--fake-tma", action="store_true", help="take the dW fold's and linear_logp's TMA routes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100, help="steps per round")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP", help="cProfile the training step, TOP rows")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative", "ncalls"),
                    help="the profile's order")
    ap.add_argument("--quick", action="store_true", help="the catalog's --quick cases (tiny lengths; a smoke run)")
    args = ap.parse_args()
    if torch.cuda.is_available():
        raise SystemExit("host_cpu_probe: a CPU-box diagnostic (kernels stubbed); on a GPU use scripts/host_probe.py")
    torch.autograd.set_multithreading_enabled(False)
    stubs = Stubs(args.fake_tma)
    for case in catalog(args.quick):
        if case.runner != "op" or (args.op and case.op not in args.op):
            continue
        if args.case and not any(c in case.id for c in args.case):
            continue
        try:
            lines = probe(case, stubs, args.rounds, args.steps, args.profile, args.sort)
        except Exception as exc:  # e.g. a launch that bypasses FastLaunch needs a driver: say so, go on
            lines = [f"{case.id}: not probed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"]
        for line in lines:
            print(line, flush=True)


if __name__ == "__main__":
    main()
