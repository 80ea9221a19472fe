"""Batch-invariant lm_head (hidden @ W^T -> logits [R, V]) on the det_linear machinery.

The same non-split-K GEMM as ``gemm.det_linear``: tile shapes are autotuned per (row bucket,
V, K) -- the key includes V, so the wide vocabulary (up to 151936) gets its own tiles -- and the
K order never changes; dW [V, K] is the canonical fold into ``fold.main_grad``.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels.gemm import TILE, det_linear

__all__ = ["TILE", "lm_head"]


def lm_head(hidden: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
            fold: CanonicalFold | None) -> torch.Tensor:
    """Logits [R, V] = hidden [R, K] @ weight [V, K]^T, bf16 in/out, fp32 accumulate, batch-invariant."""
    return det_linear(hidden, weight, rows, fold)
