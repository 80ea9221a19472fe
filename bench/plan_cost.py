"""Host cost of a call's plans, cold (first call of a layout in a step) vs warm (every further layer or parameter
of the step: the plan caches are keyed by row content), on the box it runs on. The bench's op cases repeat one
layout, so their end-to-end figures include warm plans; this script gives the cold figure beside them.

Usage (repo root): PYTHONPATH=. python3 bench/plan_cost.py OUT.json [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from gradsweep.bench.cases import irregular
from gradsweep.bench.catalog.fold_plan import _thirds
from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches


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


def _fold(device: torch.device) -> dict:
    lengths = list(irregular(16384, 13))
    x = torch.zeros(16384, 8, dtype=torch.bfloat16, device=device)
    out = {}
    for calls in (1, 3):
        cuts = [_thirds(n) if calls == 3 else [n] for n in lengths]
        pieces = [[(s, sum(c[:k]), c[k]) for s, c in enumerate(cuts) if c[k] > 0] for k in range(calls)]

        def step(cold: bool, pieces=pieces):
            if cold:
                clear_plan_caches()
            fold = CanonicalFold(torch.zeros(8, device=device), lengths, 64)
            for call in pieces:
                rows = RowIdentity.packed([p[2] for p in call], [p[0] for p in call], [p[1] for p in call])
                fold.take_tiles(rows, (x[:rows.num_rows],))
        out[f"{calls} call(s)"] = {"cold_us_per_call": _median_us(lambda: step(True)) / calls,
                                   "warm_us_per_call": _median_us(lambda: step(False)) / calls}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "fold (16384 rows)":
              _fold(device)}
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
