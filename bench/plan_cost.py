"""Host cost of an attention call's plan, cold (first call of a layout in a step) vs warm (every further layer of
the step: plans are keyed by row content), on the box it runs on. The bench's op cases repeat one layout, so
their end-to-end figures include warm plans; this script gives the cold figure beside them. (The fold's plan has
its own cold and warm bench cases, ``fold_plan``; bench/results/plan_cost_h200.json also holds fold figures from
the first version of this script, which measured them a second time.)

Usage (repo root): PYTHONPATH=. python3 bench/plan_cost.py OUT.json [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gradsweep.canonical import RowIdentity


def _median_us(fn, reps: int = 50) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _attention(family: str, device: torch.device) -> dict:
    from gradsweep.families import kernel_module

    mod = kernel_module(family, "attention")
    out = {}
    layouts = {"prefill 8 x 1024": ([1024] * 8, RowIdentity.packed([1024] * 8)),
               "decode 64 x 1 at position 4096": ([4097] * 64, RowIdentity.packed([1] * 64, list(range(64)),
                                                                                  [4096] * 64))}
    for name, (lengths, rows) in layouts.items():
        cache = mod.AttentionCache(lengths, 32, 128, device, kv_heads=8)

        def cold(cache=cache, rows=rows):
            cache._plans.clear()
            cache.plan(rows)

        out[name] = {"cold_us": _median_us(cold), "warm_us": _median_us(lambda c=cache, r=rows: c.plan(r))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    result: dict[str, object] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    for family in ("triton", "cuda"):
        try:
            result[f"attention plan, {family}"] = _attention(family, device)
        except Exception as e:  # the family cannot run here (no extension, no GPU)
            result[f"attention plan, {family}"] = f"not measured: {type(e).__name__}: {e}"
    text = json.dumps(result, indent=1)
    print(text)
    with open(args.out, "w") as fh:
        fh.write(text + "\n")


if __name__ == "__main__":
    main()
