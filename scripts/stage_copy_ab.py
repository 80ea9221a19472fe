"""The fold's staging copy two ways, host and device time: a diagnostic for issue 13 (not a benchmark).

Without a piece copy, a staged fold call builds a [2, rows] int64 index on the host (source row, staging row of
every staged row), uploads it, and runs ``index_select`` + ``index_copy_`` per row tensor (two launches each,
and a temporary the size of the staged rows). The Triton family's piece copy
(``gradsweep.triton_kernels.stage_copy.copy_pieces``) takes the staged rows as their pieces (source row, staging
row, length: ~25 a call) and copies each piece's rows straight into the staging tensor, one launch per tensor:
the same bytes moved once instead of twice, O(pieces) uploaded instead of O(rows). Where gradsweep._C is built
with one, the CUDA C++ family's piece copy (``gradsweep.cuda_kernels.stage_copy.copy_pieces``) is a third side.
Every piece side is checked bit-equal to the index side; host figures are per call (issue time, device not
drained), device figures with the device drained.

    PYTHONPATH=. python3 scripts/stage_copy_ab.py OUT.json
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from gradsweep.canonical import _piece_rows
from gradsweep.triton_kernels.stage_copy import copy_pieces
from gradsweep.uploads import upload


def pieces_of(rng: np.random.Generator, rows: int, staged: int, n_pieces: int) -> np.ndarray:
    """[P, 3] int32 (src row, dst row, length): disjoint source and staging ranges, ``staged`` rows in all."""
    cuts = np.sort(rng.choice(np.arange(1, staged), size=n_pieces - 1, replace=False))
    length = np.diff(np.concatenate(([0], cuts, [staged])))
    dst = np.concatenate(([0], np.cumsum(length)[:-1]))
    order = rng.permutation(n_pieces)
    gaps = rng.integers(0, (rows - staged) // n_pieces, size=n_pieces)
    lens = length[order]
    src_of = np.empty(n_pieces, dtype=np.int64)
    src_of[order] = np.cumsum(gaps + lens) - lens  # each piece after the one before it and a gap: disjoint
    return np.stack([src_of, dst, length], 1).astype(np.int32)


def index_of(pieces: np.ndarray) -> np.ndarray:
    """Today's [2, rows] int64 index: the fold's own expansion of the pieces (``canonical._piece_rows``)."""
    src0, dst0, length = pieces.T.astype(np.int64)
    return _piece_rows(src0, dst0, length)


def today(pieces: np.ndarray, tensors, stages, device) -> None:
    idx = upload(index_of(pieces), device)
    src, dst = idx.unbind(0)
    for st, t in zip(stages, tensors):
        st.index_copy_(0, dst, t.index_select(0, src))


def by_pieces(pieces: np.ndarray, tensors, stages, device, copy=copy_pieces) -> None:
    dev = upload(pieces, device)
    longest = int(pieces[:, 2].max())
    for st, t in zip(stages, tensors):
        copy(dev, t, st, longest)


def cuda_piece_copy():
    """The CUDA C++ family's piece copy, or None where gradsweep._C is not built with one (imported by name: the
    module comes with the CUDA family's piece copy)."""
    from gradsweep.cuda_kernels import runtime

    try:
        module = importlib.import_module("gradsweep.cuda_kernels.stage_copy")
    except ImportError:
        return None
    ok, _ = runtime.cuda_status()
    return module.copy_pieces if ok and hasattr(runtime.ext(), "copy_pieces") else None


def timed(fn, steps: int, drained: bool) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
        if drained:
            torch.cuda.synchronize()
    if not drained:
        host = time.perf_counter() - t0
        torch.cuda.synchronize()
        return host / steps * 1e6
    return (time.perf_counter() - t0) / steps * 1e6


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    device = torch.device("cuda")
    rng = np.random.default_rng(0)
    cuda_copy = cuda_piece_copy()
    results, ok = [], True
    for rows, width, staged, n_pieces in [(16384, 4096, 5000, 25), (16384, 4096, 600, 13), (4096, 4096, 1500, 8)]:
        pieces = pieces_of(rng, rows, staged, n_pieces)
        tensors = [torch.randn(rows, width, device=device).to(torch.bfloat16) for _ in range(2)]
        stage_a = [torch.zeros(staged, width, device=device, dtype=torch.bfloat16) for _ in range(2)]
        today(pieces, tensors, stage_a, device)
        sides = [("index_select+index_copy_", today, stage_a)]
        row = {"rows": rows, "width": width, "staged": staged, "pieces": n_pieces, "bits_equal": True}
        for name, copy in (("piece copy", copy_pieces), ("cuda piece copy", cuda_copy)):
            if copy is None:
                continue
            stage = [torch.zeros_like(s) for s in stage_a]
            side = functools.partial(by_pieces, copy=copy)
            side(pieces, tensors, stage, device)
            torch.cuda.synchronize()
            row["bits_equal"] &= all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                                     for a, b in zip(stage_a, stage))
            sides.append((name, side, stage))
        equal = row["bits_equal"]
        ok &= equal
        for name, side, stages in sides:
            def fn(side=side, stages=stages, pieces=pieces, tensors=tensors) -> None:
                side(pieces, tensors, stages, device)

            host = statistics.median(timed(fn, args.steps, False) for _ in range(3))
            dev = statistics.median(timed(fn, args.steps // 4, True) for _ in range(3))
            row[name] = {"host_us": host, "drained_us": dev}
            print(f"rows {rows} staged {staged} in {n_pieces} pieces, width {width} x2: {name:26s} "
                  f"host {host:6.1f} us  drained {dev:6.1f} us  bits {'equal' if equal else 'DIFFER'}", flush=True)
        results.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
