"""Batch-invariant lm_head (hidden @ W^T -> logits [R, V]) on the CUDA det_linear machinery.

The same non-split-K tensor-core GEMM as ``gemm.det_linear`` (tile configuration by M, K order fixed);
dW [V, K] is the canonical fold into ``fold.main_grad``.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels.gemm import TILE, det_linear

__all__ = ["TILE", "lm_head"]


def lm_head(hidden: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
            fold: CanonicalFold | None) -> torch.Tensor:
    """Logits [R, V] = hidden [R, K] @ weight [V, K]^T, bf16 in/out, fp32 accumulate, batch-invariant."""
    return det_linear(hidden, weight, rows, fold)
