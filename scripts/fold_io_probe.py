"""Device time of the CUDA Hopper dW fold under each way of moving the FP32 main grad (a diagnostic for one kernel
change, never evidence): GRADSWEEP_FOLD_IO = 0 (4-byte accesses per accumulator element, the signed tree's kernel),
1 (8-byte pairs), 2 (pairs in, the store through shared memory as coalesced 16-byte row chunks), 3 (both through
shared memory), read by an A/B build of gemm_fold_sm90.cu at every call; with it GRADSWEEP_FOLD_FENCE = 0 (the
consumers fence a stage for the async proxy only when the producer gathered it by cp.async, a flag per stage in
shared memory; the signed kernel fences every stage, TMA-loaded ones included) and GRADSWEEP_FOLD_GROUP (row tiles
per column tile in the launch order, 8 in the signed kernel).

Why: ptxas of the signed kernel shows 128 scalar ld.global.f32 and 128 st.global.f32 per consumer thread for the
128 x 256 FP32 tile (CuTe cannot prove the pairs aligned), half-used sectors on every store; the fold reads and
writes that tile once per CTA (4 waves at N = K = 4096) with the tensor cores idle. Triton's fold (the same tile,
255 against 285 us at T = 4096 in the thirty-first session) stores through a coalesced layout.

Cases: the bench's packed steps (13 samples, T = 4096 and 16384, N = K = 4096), the plan from ``CanonicalFold.take``
as the CUDA det_gemm backward makes it. Every variant folds the same plan into the same start, and its bits must
equal variant 0's (the same wgmma chain from the same loaded values). Times: CUDA events over 10 calls a sample,
variants interleaved round by round after 150 ms of heat, median of the rounds; beside them cuBLAS's bf16 dY^T X
(the bench's baseline), cuBLAS with an FP32 C read and written (``addmm(G, dY^T, X, out_dtype=float32)``: the
fold's main-grad traffic, a fair ceiling for it) and Triton's fold.

    python3 scripts/fold_io_probe.py OUT/fold_io.json            (the A/B build: every variant)
    python3 scripts/fold_io_probe.py --plain OUT/fold_plain.json  (any other build: its own dispatch, no knobs)

Where the fold's time over cuBLAS goes (forty-sixth session: neither the main grad's read at a wave's start nor the
stages' L2 reads): ``--t 1024,4096,16384`` times more token counts (the gap over cuBLAS is constant in T at 4096
and 16384, so it is per output tile, not per stage: a third T tells a fixed cost from a proportional one), and
``--aligned`` makes every sample a whole number of 64-token tiles (T / 64 tiles, none short), which separates what
the short tiles cost from the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gradsweep.bench.cases import irregular
from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches
from gradsweep.cuda_kernels import gemm as cuda_gemm

# name -> the A/B build's environment (GRADSWEEP_FOLD_IO, GRADSWEEP_FOLD_FENCE: 0 fences only the gathered
# stages, GRADSWEEP_FOLD_GROUP: row tiles per column tile in the launch order); "io0" is the signed kernel.
VARIANTS = {
    "io0": {"IO": 0}, "io1": {"IO": 1}, "io2": {"IO": 2}, "io3": {"IO": 3},
    "io0_nofence": {"IO": 0, "FENCE": 0}, "io2_nofence": {"IO": 2, "FENCE": 0},
    "io2_group4": {"IO": 2, "GROUP": 4}, "io2_group16": {"IO": 2, "GROUP": 16},
}
# `--traffic`: the diagnostic build of notes/wip/fold-traffic-knobs-DIAGNOSTIC.patch (GRADSWEEP_FOLD_TRAFFIC): the
# 16-byte-chunk kernel with its main-grad load, its store or both left out, timed beside the full kernel (their bits
# differ by design, and "full" is the reference itself: this mode checks no bits; the GPU tests do).
TRAFFIC_VARIANTS = {"full": {}, "noload": {"TRAFFIC": 1}, "nostore": {"TRAFFIC": 2}, "notraffic": {"TRAFFIC": 3}}
_KNOBS = ("IO", "FENCE", "GROUP", "TRAFFIC")
N = K = 4096
CALLS = 10
ROUNDS = 15


def _timed(fn, calls: int = CALLS) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000.0 / calls  # us per call


def _heat(fn, ms: float = 150.0) -> None:
    t = _timed(fn, 3)
    for _ in range(max(1, int(ms * 1000.0 / max(t, 1.0)))):
        fn()
    torch.cuda.synchronize()


def _variant(name: str):
    env = VARIANTS.get(name, TRAFFIC_VARIANTS.get(name, {}))

    def run(plan, x, dy, g):
        for knob in _KNOBS:
            if knob in env:
                os.environ[f"GRADSWEEP_FOLD_{knob}"] = str(env[knob])
            else:
                os.environ.pop(f"GRADSWEEP_FOLD_{knob}", None)
        cuda_gemm.dw_fold_raw(plan, x, dy, g)
    return run


def cublas_sides(g: torch.Tensor, dy: torch.Tensor, x: torch.Tensor) -> tuple[dict, str | None]:
    """cuBLAS's bf16 ``dY^T X`` (the bench's baseline) and, where this torch has it, cuBLAS reading and writing an
    FP32 C (beta = 1) as the fold does its main grad ``g``: the fold's fair ceiling. (sides, why the second is
    missing, or None)"""
    sides = {"cublas": lambda: torch.mm(dy.t(), x)}
    try:
        torch.addmm(g, dy.t(), x, out_dtype=torch.float32)
    except (RuntimeError, TypeError) as exc:
        return sides, f"{type(exc).__name__}: {exc}"
    sides["cublas_f32c"] = lambda: torch.addmm(g, dy.t(), x, out_dtype=torch.float32)
    return sides, None


def time_sides(sides: dict) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """Each side once, 150 ms of heat, then ROUNDS rounds of every side in turn (CALLS calls a sample): each side's
    median us per call and its (min, max) over the rounds."""
    for fn in sides.values():
        fn()
    torch.cuda.synchronize()
    _heat(lambda: [fn() for fn in sides.values()])
    samples: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(ROUNDS):
        for k, fn in sides.items():
            samples[k].append(_timed(fn))
    return ({k: statistics.median(v) for k, v in samples.items()},
            {k: (min(v), max(v)) for k, v in samples.items()})


def packed_operands(t: int, aligned: bool = False) -> tuple[list[int], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The bench's packed step of T = t tokens (13 samples) at N = K = 4096, seeded by t: (lengths, X, dY, G);
    ``aligned``: the same number of samples, each a whole number of 64-token tiles."""
    torch.manual_seed(t)
    lengths = [64 * n for n in irregular(t // 64, 13)] if aligned else list(irregular(t, 13))
    x = (torch.randn(t, K, device="cuda") * 0.5).to(torch.bfloat16)
    dy = (torch.randn(t, N, device="cuda") * 0.5).to(torch.bfloat16)
    return lengths, x, dy, torch.randn(N, K, device="cuda")


def case(t: int, variants: dict, aligned: bool = False) -> dict:
    lengths, x, dy, g0 = packed_operands(t, aligned)
    clear_plan_caches()
    fold = CanonicalFold(torch.zeros(N, K, device="cuda"), lengths, cuda_gemm.TILE)
    plan = fold.take(RowIdentity.packed(lengths), (x, dy)).plan
    out: dict = {"T": t, "tiles": int(plan.shape[0]), "bits": {}, "us": {}}
    ref = None
    for v in variants:
        g = g0.clone()
        _variant(v)(plan, x, dy, g)
        torch.cuda.synchronize()
        if ref is None:
            ref = g
        out["bits"][v] = bool(torch.equal(g.view(torch.int32), ref.view(torch.int32)))
    g = g0.clone()
    sides = {v: (lambda v=v: _variant(v)(plan, x, dy, g)) for v in variants}
    baselines, missing = cublas_sides(g, dy, x)
    sides.update(baselines)
    if missing is not None:
        print(f"  cuBLAS with an FP32 C unavailable: {missing}")
    try:
        from gradsweep.triton_kernels import gemm as triton_gemm
        clear_plan_caches()
        tfold = CanonicalFold(torch.zeros(N, K, device="cuda"), lengths, triton_gemm.TILE)
        tstep = tfold.take_tiles(RowIdentity.packed(lengths), (x, dy))
        sides["triton"] = lambda: triton_gemm.dw_fold(tstep, x, dy, g)
    except Exception as exc:  # a diagnostic: report it and time the rest
        print(f"  triton fold unavailable: {type(exc).__name__}: {exc}")
    out["us"], out["spread"] = time_sides(sides)
    for knob in _KNOBS:
        os.environ.pop(f"GRADSWEEP_FOLD_{knob}", None)
    return out


def report_lines(results: list[dict]) -> list[str]:
    """The printed report of ``case`` results (scripts/fold_ab_verdict.py reads it back): per T a header, then each
    side's median, its ratio to the same process's cuBLAS bf16 and its spread over the rounds."""
    lines = []
    for r in results:
        cub = r["us"]["cublas"]
        lines.append(f"T={r['T']} ({r['tiles']} tiles of 64), N=K={N}: bits equal to the first: {r['bits']}")
        for k, us in r["us"].items():
            lo, hi = r["spread"][k]
            lines.append(f"  {k:12s} {us:8.1f} us  ({us / cub:.3f}x cuBLAS; rounds {lo:.1f}-{hi:.1f})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description="Device time of the CUDA Hopper dW fold (a diagnostic).")
    ap.add_argument("out", nargs="?", type=Path, help="write the results as JSON here")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--plain", action="store_true", help="any build: its own dispatch, no knobs")
    mode.add_argument("--traffic", action="store_true", help="the diagnostic build: main-grad load / store left out")
    ap.add_argument("--aligned", action="store_true", help="every sample a whole number of 64-token tiles")
    ap.add_argument("--t", default="4096,16384", help="token counts, comma-separated (default 4096,16384)")
    args = ap.parse_args()
    counts = tuple(int(v) for v in args.t.split(","))
    print(torch.cuda.get_device_name(), "SMs", torch.cuda.get_device_properties(0).multi_processor_count)
    variants = TRAFFIC_VARIANTS if args.traffic else {"default": {}} if args.plain else VARIANTS
    results = [case(t, variants, args.aligned) for t in counts]
    print("\n".join(report_lines(results)))
    ok = args.traffic or all(all(r["bits"].values()) for r in results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
