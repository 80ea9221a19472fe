"""The release drift run on a Hopper box: Qwen3-8B shapes (2 layers), the release samples (2912 tokens), stock
torch and the batch-invariant profiles, packed (train) vs decode (inference), boundary by boundary; timed.

Pairs: each profile's bn_full vs decode (bitwise claims), and the Triton trainer vs a stock-torch inference
engine (tolerance-based cross-backend parity). Run ``--repeat`` times in one process: the first run pays the
Triton compilation (cold), the last one is what a warm box takes; outputs come from the last run.

Usage (repo root, on the GPU machine):
  PYTHONPATH=. python3 bench/bench_drift.py OUTDIR --key KEY.pem [--manifest manifests/h200.yaml] [--repeat 2]
  PYTHONPATH=. python3 bench/bench_drift.py OUTDIR --from-json --key KEY.pem   # plot, table and sign a drift.json
                                                                             # that a box without matplotlib wrote
Writes OUTDIR/drift.json, drift.table.txt, drift.png, drift.evidence.json and bench_drift.json (timings).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

QWEN3_8B = {"hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128, "intermediate": 12288, "vocab": 151936,
            "eps": 1e-6, "rope_theta": 1.0e6}
TARGET_S = 60.0  # the budget for the release drift run on one H200


def _pairs(profiles: list[str]):
    from gradsweep.drift import Pair, Role

    pairs = [Pair(Role(p, "bn_full"), Role(p, "decode")) for p in profiles]
    if "triton_cuda_bf16" in profiles and "torch_bf16" in profiles:
        pairs.append(Pair(Role("triton_cuda_bf16", "bn_full"), Role("torch_bf16", "decode")))
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--key", type=Path, default=None, help="signing key (default: $GRADSWEEP_KEY, else the default)")
    ap.add_argument("--manifest", type=Path, default=Path("manifests/h200.yaml"))
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="runs in this process (first cold, last warm)")
    ap.add_argument("--profiles", nargs="+", default=["torch_bf16", "triton_cuda_bf16", "cuda_bf16"])
    ap.add_argument("--from-json", action="store_true", help="only plot, render and sign OUT/drift.json")
    args = ap.parse_args()
    from gradsweep.drift.outputs import table_text, write_outputs

    if args.from_json:
        report = json.loads((args.out / "drift.json").read_text())
        write_outputs(report, args.out, args.key, say=print)
        print(table_text(report))
        return 0

    import torch

    from gradsweep.drift import DriftPlan, run_drift_plan
    from gradsweep.manifest import load_manifest
    from gradsweep.nn.qwen3 import Qwen3Shape

    manifest = load_manifest(args.manifest)
    profiles = [p for p in args.profiles if p in manifest.profiles]
    shape = Qwen3Shape(**QWEN3_8B, layers=args.layers)
    timings, report = [], None
    for i in range(args.repeat):
        plan = DriftPlan(manifest, shape, _pairs(profiles))
        started = time.perf_counter()
        report = run_drift_plan(plan, say=print)
        run_s = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        timings.append({"run": i + 1, "seconds": run_s, "peak_gib": peak,
                        "pairs": {p["id"]: p.get("seconds") for p in report["pairs"]}})
        print(f"run {i + 1}/{args.repeat}: {run_s:.1f} s (peak {peak} GiB)", flush=True)
    assert report is not None
    started = time.perf_counter()
    written = write_outputs(report, args.out, args.key, say=print)
    outputs_s = time.perf_counter() - started
    warm = timings[-1]["seconds"] + outputs_s
    summary = {"manifest": str(args.manifest), "shape": shape.model_dump(), "tokens": report["samples"]["tokens"],
               "profiles": profiles, "timings": timings, "outputs_seconds": outputs_s,
               "cold_seconds": timings[0]["seconds"] + outputs_s, "warm_seconds": warm, "target_seconds": TARGET_S,
               "warm_within_target": warm < TARGET_S, "files": {k: str(v) for k, v in written.items()}}
    (args.out / "bench_drift.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(table_text(report))
    print(f"cold {summary['cold_seconds']:.1f} s, warm {warm:.1f} s (target < {TARGET_S:.0f} s): "
          f"{'PASS' if summary['warm_within_target'] else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
