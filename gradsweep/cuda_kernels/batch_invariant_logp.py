"""batch_invariant_logp (gradsweep._C): lm_head then selected-token logp, unfused (logits materialised).

The chain a trainer runs today, on this family's own invariant GEMM and logp kernels (never the Triton
family's, never a torch GEMM or softmax); gradients dhidden and dW (canonical fold into fold.main_grad).
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels.gemm import TILE, det_linear
from gradsweep.cuda_kernels.logp import selected_logp

__all__ = ["TILE", "batch_invariant_logp"]


def batch_invariant_logp(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: RowIdentity,
                         fold: CanonicalFold | None) -> torch.Tensor:
    """logp[r] = logits[r, t_r] - logsumexp(logits[r]) with logits = hidden @ weight^T (bf16); fp32 [R]."""
    return selected_logp(det_linear(hidden, weight, rows, fold), targets)
