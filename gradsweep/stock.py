"""Stock PyTorch calls shared by the ops' stock paths and gradsweep.nn's torch flavour.

Why a wrapper around SDPA: on CUDA, torch's default backend order lets cuDNN's attention plan a new
execution graph for every sequence length, so a stock decode (one key length per step) spent most of its
time planning (a 1031-step decode cell took 173 s on the H200; the same calls warm took seconds). The
status quo a trainer runs is flash / memory-efficient attention, so the stock path uses those (and the
math kernel where neither applies, e.g. FP32 for the accuracy baseline). Numerics are stock either way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` restricted to the flash, memory-efficient and math backends."""
    with sdpa_kernel(_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
