"""One bench step of one family between cudaProfilerStart / Stop, after warm-up: what Nsight Compute profiles.

    ncu --profile-from-start off --clock-control none --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats python3 scripts/ncu_step.py attention/decode_64x4096 cuda

The case id is a bench case of the manifest (``gradsweep bench`` builds the same step: shapes, layout, data);
the family is ``triton``, ``cuda`` or ``stock``. A diagnostic: the bench's signed figures are the evidence.
(notes/kernels_cuda.md: the CUDA attention fwd+bwd profile of 2026-12-01 was taken this way.)
"""

from __future__ import annotations

import argparse

import torch

from scripts.probe_cases import case_steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="a bench case id, e.g. attention/decode_64x4096")
    ap.add_argument("family", help="triton, cuda or stock")
    ap.add_argument("--manifest", default="manifests/h200.yaml")
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    op = args.case.split("/")[0]
    for found in case_steps(args.manifest, [op], [args.case], torch.device("cuda"), exact=True):
        if isinstance(found, tuple):
            raise found[1]
        ref = dict(found.refs).get(args.family)
        if ref is None:
            raise SystemExit(f"{args.case}: no {args.family} step here (families: {[n for n, _ in found.refs]})")
        with ref.context():
            for _ in range(args.warmup):
                ref.calls[0]()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            ref.calls[0]()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
        print(f"profiled one {found.mode} step of {args.case} [{args.family}]")
        return
    raise SystemExit(f"{args.case}: not a bench case of {args.manifest}")


if __name__ == "__main__":
    main()
