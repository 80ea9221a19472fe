"""The CUDA family's Hopper GEMMs under each persistent tile-scheduler setting (swizzle, raster order) next to
cuBLAS, bits compared: a diagnostic for issue 10's forward at M = 16384 (1.11-1.12x cuBLAS signed), never evidence.

Why: every CUTLASS GEMM of csrc/gemm_sm90.cuh runs with the scheduler's defaults (swizzle 1, raster order by
CUTLASS's heuristic), and the 128 x 256 / 256 x 128 cooperative kernels at large M reread the weight from L2 in
an order those settings decide; which output tile a CTA computes never changes an element's k order, so the bits
cannot move. This needs an EXPERIMENTAL build whose ``sm90::run`` reads ``GS_SM90_SWIZZLE`` and ``GS_SM90_RASTER``
(0 heuristic, 1 along M, 2 along N) from the environment at every launch (the knob never lands in main; the
production change would fix the winning setting in the code). Each (shape, setting) is a CUDA graph of calls
replayed at sustained clocks (``gemm_tile_probe``), ROUNDS rounds with the settings in turn, beside cuBLAS.

    python3 scripts/gemm_sched_ab.py [OUT.json]
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys

import torch

from gradsweep.cuda_kernels.gemm import matmul_invariant
from scripts import gemm_tile_probe as probe

# (name, M, N, K, dx): dx runs dY[M, N] @ W[N, K] (the N-major kernel), else x[M, K] @ W[N, K]^T
SHAPES = [("fwd_m256", 256, 4096, 4096, False), ("fwd_m4096", 4096, 4096, 4096, False),
          ("fwd_m16384", 16384, 4096, 4096, False), ("fwd_m4096_n14336", 4096, 14336, 4096, False),
          ("dx_m16384", 16384, 4096, 4096, True)]
SETTINGS = [(s, r) for s in (1, 2, 4, 8) for r in (0, 1, 2)]
ROUNDS = 3


def _set(setting: tuple[int, int] | None) -> None:
    for var in ("GS_SM90_SWIZZLE", "GS_SM90_RASTER"):
        os.environ.pop(var, None)
    if setting is not None:
        os.environ["GS_SM90_SWIZZLE"], os.environ["GS_SM90_RASTER"] = map(str, setting)


def main(out: str | None) -> int:
    probe.CALLS, probe.REPLAYS = 10, 10
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rows: dict[str, dict[str, list[float]]] = {}
    bits: dict[str, list[str]] = {}
    digests: dict[str, str] = {}  # of the default setting's output: two builds' runs compare their bits by it
    data = {}
    for name, m, n, k, dx in SHAPES:
        a = torch.randn(m, n if dx else k, device=dev).to(torch.bfloat16)
        w = torch.randn(n, k, device=dev).to(torch.bfloat16) * 0.05
        if dx:
            data[name] = (lambda a=a, w=w: matmul_invariant(a, w.t()), lambda a=a, w=w: a @ w)
        else:
            data[name] = (lambda a=a, w=w: matmul_invariant(a, w), lambda a=a, w=w: a @ w.t())
    for name, (ours, cublas) in data.items():
        _set(None)
        want = ours()
        digest = hashlib.sha256(want.view(torch.int16).cpu().numpy().tobytes()).hexdigest()[:16]
        rows[name], bits[name], digests[name] = {}, [], digest
        probe.heat(cublas)
        for _ in range(ROUNDS):
            rows[name].setdefault("cublas", []).append(probe.graph_time_us(cublas))
            for setting in SETTINGS:
                _set(setting)
                label = f"swizzle{setting[0]}_raster{setting[1]}"
                got = ours()
                if not torch.equal(got.view(torch.int16), want.view(torch.int16)) and label not in bits[name]:
                    bits[name].append(label)
                rows[name].setdefault(label, []).append(probe.graph_time_us(ours))
            _set(None)
    _set(None)
    print(f"{torch.cuda.get_device_name()}; median of {ROUNDS} rounds, us per call (graph replay); ratio to cuBLAS")
    summary = {}
    for name, by in rows.items():
        cb = statistics.median(by["cublas"])
        med = {label: statistics.median(v) for label, v in by.items()}
        best = min((v, label) for label, v in med.items() if label != "cublas")
        default = med["swizzle1_raster0"]
        print(f"{name}: cuBLAS {cb:.1f}; default {default:.1f} ({default / cb:.3f}x); best {best[1]} {best[0]:.1f} "
              f"({best[0] / cb:.3f}x); bits {'DIFFER in ' + ', '.join(bits[name]) if bits[name] else 'equal'}; "
              f"output digest {digests[name]}")
        print("    " + "  ".join(f"{label.replace('swizzle', 's').replace('_raster', 'r')} {v / cb:.3f}"
                                 for label, v in med.items() if label != "cublas"))
        summary[name] = {"cublas_us": cb, "us": med, "bits_differ": bits[name], "digest": digests[name]}
    if out:
        with open(out, "w") as f:
            json.dump(summary, f, indent=1)
    return 1 if any(bits.values()) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
