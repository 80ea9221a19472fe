"""The one skip rule for tests that launch the CUDA C++ family's kernels: they need a CUDA build of torch and a
gradsweep._C that reaches a driver (``runtime.cuda_status``: a CPU box with nvcc builds and imports _C, and then
gets cudaErrorInsufficientDriver, which must skip, not fail). Mark such tests ``@pytest.mark.gpu`` (the suite's
selector) and ``@needs_cuda_kernels`` (the skip, with the reason)."""

from __future__ import annotations

import pytest
import torch

from gradsweep.cuda_kernels import runtime


def cuda_kernels_ready() -> tuple[bool, str]:
    if not torch.cuda.is_available():
        return False, "no CUDA in torch"
    return runtime.cuda_status()


CUDA_OK, CUDA_WHY = cuda_kernels_ready()
needs_cuda_kernels = pytest.mark.skipif(not CUDA_OK, reason=f"CUDA kernels cannot run here: {CUDA_WHY}")
