"""scripts/host_cpu_probe.py runs on a CPU box: the Triton family's GPU code paths with the kernels stubbed, each
launch counted. A smoke run on the catalog's quick cases, in a process without TRITON_INTERPRET (the probe times
the GPU's host path, not the interpreter's)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.helpers import run_clean


@pytest.mark.skipif(torch.cuda.is_available(), reason="the probe refuses a GPU box")
def test_host_cpu_probe_counts_the_launches_of_a_step():
    res = run_clean(["scripts/host_cpu_probe.py", "--quick", "--op", "rms_norm", "--op", "det_gemm", "--case", "bwd",
                     "--case", "dw", "--fake-tma", "--rounds", "1", "--steps", "2"], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    launches = dict(re.findall(r"^(\S+ \w+): [\d.]+ us per step, (\d+) launches$", res.stdout, re.M))
    # rms_norm: the forward; then the backward kernel and the dweight fold (a packed step leaves no row over)
    assert launches["rms_norm/bwd fwd_train"] == "1" and launches["rms_norm/bwd fwd_bwd"] == "3", res.stdout
    # det_gemm dW: the forward GEMM; the backward's dW fold by TMA windows (params only: no dX)
    assert launches["det_gemm/dw_t4096 fwd_train"] == "1", res.stdout
    assert int(launches["det_gemm/dw_t4096 fwd_bwd"]) >= 2, res.stdout
    assert re.search(r"^rms_norm/bwd bwd \(fwd_bwd - fwd_train\): -?[\d.]+ us$", res.stdout, re.M), res.stdout
