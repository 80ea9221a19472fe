"""Triton dW fold: the masked gather against the TMA row windows, on the bench's steps (sustained e2e + trace)."""
import sys

import torch

from gradsweep.triton_kernels import gemm
from scripts.host_probe import rotate
from scripts.probe_cases import case_steps
from scripts.timeline_probe import sustain, trace_side

real = gemm._dw_tma_ok
for found in case_steps("manifests/h200.yaml", sys.argv[1].split(","), sys.argv[2].split(","), torch.device("cuda")):
    if isinstance(found, tuple):
        print("could not build", found)
        continue
    for name, ref in found.refs:
        if name != "triton":
            continue
        with ref.context():
            step = rotate(ref.calls)
            for mode in ("gather", "tma"):
                gemm._dw_tma_ok = real if mode == "tma" else (lambda *a: False)
                print(f"{found.case.id} {found.mode} [{name}] {mode}", flush=True)
                for line in trace_side(step, 4) + sustain(step, 2.0):
                    if "gap " not in line:
                        print(line, flush=True)
gemm._dw_tma_ok = real
