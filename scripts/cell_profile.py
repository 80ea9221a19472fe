"""Where a sweep cell's time goes: a diagnostic for the release sweep's cost (not a benchmark, not evidence).

The release sweep on an H100 (2026-12-06) spent 529 s in its cells, 272 s of it in the chain: its first cell per
profile (``b1_singleton``, 47-56 s) and ``decode`` (24-44 s) against ~2 s for every other layout. This runs the
given cells in one process, in the order given, as one sweep worker would (the harness's per-op caches, the
baselines and reference runs, are shared across the cells exactly as in a worker), each under cProfile, with the
harness's phases timed apart (``op_baselines``: the FP64 reference and stock runs; ``reference_run``: the
candidate on the reference layout; ``judge``: the layout's calls, reruns and comparisons, and the two others, which
it computes on first use), and prints per cell
its wall time, the phases and the functions with the most cumulative and own time. ``--sync`` makes each phase's
time device time too (a ``torch.cuda.synchronize()`` at its edges).

    PYTHONPATH=. python3 scripts/cell_profile.py manifests/h200.yaml OUT.json \\
        chain/cuda_bf16/b1_singleton chain/cuda_bf16/bn_full chain/cuda_bf16/decode
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import time
from collections import defaultdict
from pathlib import Path

from gradsweep.env_policy import raw_profile_env

PHASES = ("op_baselines", "reference_run", "judge")


def _timed_phases(cell_module, sync: bool) -> tuple[dict[str, float], dict]:
    """Wrap the harness's phase functions where run_cell looks them up; their times add up in the dict. Also
    returns the originals, to put back after the cell."""
    spent: dict[str, float] = defaultdict(float)
    originals = {name: getattr(cell_module, name) for name in PHASES}

    def wrap(name: str):
        inner = getattr(cell_module, name)

        def timed(*args, **kwargs):
            if sync:
                _synchronize()
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                if sync:
                    _synchronize()
                spent[name] += time.perf_counter() - t0

        setattr(cell_module, name, timed)

    for name in PHASES:
        wrap(name)
    return spent, originals


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _functions(profile: cProfile.Profile) -> list[dict]:
    """Every profiled function: its calls, own and cumulative seconds."""
    stats = pstats.Stats(profile, stream=io.StringIO())
    return [{"function": f"{Path(file).name}:{line}({func})", "calls": calls, "own_s": round(own, 3),
             "cum_s": round(cum, 3)} for (file, line, func), (_, calls, own, cum, _) in stats.stats.items()]


def _top(rows: list[dict], key: str, n: int) -> list[dict]:
    return sorted(rows, key=lambda r: r[key], reverse=True)[:n]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("manifest", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("cells", nargs="+", help="op/profile/layout, run in this order in one process")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--sync", action="store_true", help="synchronize the device at each phase's edges")
    args = p.parse_args()
    keys = [tuple(c.split("/")) for c in args.cells]
    if any(len(k) != 3 for k in keys):
        p.error("each cell is op/profile/layout")
    profiles = {k[1] for k in keys}
    if len(profiles) != 1:
        p.error("one profile per run: a worker holds one profile's environment")
    os.environ.update(raw_profile_env(args.manifest, profiles.pop()))  # before the harness is imported

    from gradsweep.harness import cell as cell_module
    from gradsweep.manifest import load_manifest
    from gradsweep.results import CellKey

    manifest = load_manifest(args.manifest)
    results = []
    for op, profile, layout in keys:
        spent, originals = _timed_phases(cell_module, args.sync)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        res = cell_module.run_cell(manifest, CellKey(op=op, profile=profile, layout=layout))
        prof.disable()
        _synchronize()
        wall = time.perf_counter() - t0
        for name, fn in originals.items():  # unwrapped: the next cell wraps afresh, with its own totals
            setattr(cell_module, name, fn)
        functions = _functions(prof)
        row = {"cell": f"{op}/{profile}/{layout}", "status": str(res.status), "wall_s": round(wall, 2),
               "phases_s": {k: round(v, 2) for k, v in spent.items()},
               "top_cumulative": _top(functions, "cum_s", args.top), "top_own": _top(functions, "own_s", args.top)}
        results.append(row)
        print(f"{row['cell']}: {row['status']} in {wall:.1f} s; phases {row['phases_s']}", flush=True)
        for r in row["top_own"][:12]:
            print(f"    own {r['own_s']:8.3f} s  cum {r['cum_s']:8.3f} s  {r['calls']:>8}  {r['function']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"manifest": str(args.manifest), "sync": args.sync, "cells": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
