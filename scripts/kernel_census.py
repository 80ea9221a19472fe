"""Which kernels each family's step launches, their device time, and the step's pace: the profile behind a
missed speed row (a diagnostic, never evidence; the signed bench holds the figures).

    python3 scripts/kernel_census.py OUT --op det_gemm --case fwd_m256 --case dx_m1
    CUBLAS_WORKSPACE_CONFIG=:16:8 CUBLASLT_WORKSPACE_SIZE=1 python3 scripts/kernel_census.py OUT --tag starved ...
    python3 scripts/kernel_census.py OUT --missed-from out/h200.bench-*.evidence.json   # every missed row's case

For every selected bench case (``gradsweep bench``'s own steps, shapes and data: scripts/probe_cases.py) and each
family and stock: the step issued back to back (device us per step and host us per step, as the bench samples
it), then STEPS steps under torch.profiler: every device kernel by name with its launches per step and its mean
duration, and the device-busy time per step. What it answers: does stock cuBLAS split K where the design forbids
it (a second, reducing kernel, or a split-K kernel name), is a row host-bound (busy << pace), which of a family's
kernels holds the time. ``--tag starved`` with cuBLAS's workspace starved records stock without split-K
(the issue's orientation figure), side by side in OUT/census-<tag>.json. ``--missed-from`` takes signed bench
evidence and censuses exactly the cases with a missed target (``scripts/h200_closeout.sh --census`` runs it after
the benches of a closeout, so every missed row comes back with its profile from the same run).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.bench.evidence import read_bench
from scripts.probe_cases import back_to_back, case_steps, log_to, probe_parser

STEPS = 20


def kernel_table(step, steps: int = STEPS) -> tuple[list[dict], float]:
    """(kernels by name: launches per step, mean us, us per step; device-busy us per step) over ``steps``."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time > 0:
            by_name[ev.name].append(ev.device_time)
    rows = [{"kernel": name[:160], "per_step": len(t) / steps, "mean_us": round(statistics.fmean(t), 2),
             "us_per_step": round(sum(t) / steps, 2)} for name, t in by_name.items()]
    rows.sort(key=lambda r: -r["us_per_step"])
    return rows, round(sum(r["us_per_step"] for r in rows), 2)


def missed_cases(paths: list[Path]) -> tuple[list[str], list[str]]:
    """(ops, case ids) of the cases of these bench evidence files with a missed target in any family (the host-only
    fold plan's included: ``case_steps`` skips what has no device step)."""
    ids: dict[str, str] = {}
    for path in paths:
        for case in read_bench(path).cases:
            if any(t.met is False for fam in case.families.values() for t in fam.targets):
                ids[case.id] = case.op
    return sorted(set(ids.values())), sorted(ids)


def main() -> None:
    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--tag", default="default", help="names the output (e.g. 'starved' for a starved cuBLAS run)")
    ap.add_argument("--seconds", type=float, default=1.0, help="back-to-back seconds per step")
    ap.add_argument("--family", action="append", default=[], help="only these (triton, cuda, stock); default all")
    ap.add_argument("--missed-from", nargs="+", type=Path, default=[],
                    help="bench evidence files: census exactly their cases with a missed target")
    args = ap.parse_args()
    if args.missed_from:
        args.op, args.case = missed_cases(args.missed_from)
        if not args.case:
            print("no missed target in", ", ".join(map(str, args.missed_from)))
            return
    say = log_to(args.out, f"census-{args.tag}.txt")
    out: dict[str, dict] = {"device": torch.cuda.get_device_name(), "tag": args.tag, "cases": {}}
    for found in case_steps(args.manifest, args.op, args.case, torch.device("cuda"), exact=bool(args.missed_from)):
        if isinstance(found, tuple):
            say(f"{found[0].id}: could not build: {found[1]!r}")
            continue
        entry = out["cases"].setdefault(found.case.id, {"mode": found.mode})
        for family, ref in found.refs:
            if args.family and family not in args.family:
                continue
            with ref.context():
                step = ref.calls[0]
                for _ in range(5):
                    step()
                host: list[float] = []
                pace = statistics.median(back_to_back(step, args.seconds, host))
                host_us = statistics.median(host) * 1e6
                kernels, busy = kernel_table(step)
            entry[family] = {"pace_us": round(pace, 2), "host_us": round(host_us, 2), "busy_us": busy,
                             "kernels": kernels}
            names = "; ".join(f"{k['kernel'][:70]} x{k['per_step']:g} {k['mean_us']}us" for k in kernels[:4])
            say(f"{found.case.id} [{family}] pace {pace:.1f} us, host {host_us:.1f} us, busy {busy:.1f} us: {names}")
        tmp = args.out / f"census-{args.tag}.json.tmp"
        tmp.write_text(json.dumps(out, indent=1))
        tmp.replace(args.out / f"census-{args.tag}.json")


if __name__ == "__main__":
    main()
