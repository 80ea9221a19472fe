"""Which kernel module serves an op for a family, and the attention call shared by both backward modes.

A family's kernel modules have one public API per op (``gradsweep.triton_kernels.<op>`` and
``gradsweep.cuda_kernels.<op>``); gradsweep.nn imports them lazily (a worker sets TRITON_INTERPRET before
the first import) and never falls back to another family: a missing module is a one-line error.
"""

from __future__ import annotations

import inspect
from types import ModuleType

import numpy as np
import torch

from gradsweep import families
from gradsweep.canonical import RowIdentity
from gradsweep.families import KERNEL_FAMILIES

__all__ = ["KERNEL_FAMILIES", "MODULE_OF", "AttentionCall", "fold_tile", "kernel_module", "new_attention_cache"]
# module holding each op's kernel (the GEMM's public function lives in ``gemm``)
MODULE_OF = {"embedding": "embedding", "rms_norm": "rms_norm", "qk_norm": "qk_norm", "linear": "gemm",
             "rope": "rope", "swiglu": "swiglu", "linear_logp": "linear_logp", "attention": "attention"}


def kernel_module(family: str, op: str) -> ModuleType:
    """The family's kernel module of ``op`` (never another family's)."""
    try:
        return families.kernel_module(family, MODULE_OF[op])
    except ModuleNotFoundError as exc:
        name = f"gradsweep.{families.KERNEL_PACKAGES[family]}.{MODULE_OF[op]}"  # type: ignore[index]
        if exc.name != name:
            raise
        raise ModuleNotFoundError(f"the {family} family has no {op} kernel ({name} does not exist yet); "
                                  "a family never borrows another family's kernel", name=name) from None


def fold_tile(family: str, op: str) -> int:
    """Canonical tile of the fold of ``op``'s weight gradient in this family."""
    return int(kernel_module(family, op).TILE)


# ------------------------------------------------------------------------------------------------ attention
def new_attention_cache(mod: ModuleType, lengths, heads: int, kv_heads: int, head_dim: int, device):
    """One layer's attention state for the step (K/V store, FP32 dK/dV, the fold over query tiles)."""
    if "kv_heads" in inspect.signature(mod.AttentionCache).parameters:
        return mod.AttentionCache(lengths, heads, head_dim, device, kv_heads=kv_heads)
    if kv_heads != heads:
        raise ValueError(f"{mod.__name__} has no grouped-query attention (its AttentionCache takes no kv_heads); "
                         f"use kv_heads = heads ({heads}) with this family")
    return mod.AttentionCache(lengths, heads, head_dim, device)


class AttentionCall:
    """One call's attention over its rows: forward now, dQ later, dK/dV once the layer's fold is complete.

    The kernel folds dK/dV over canonical query tiles of the whole step; they are final only when every call's
    attention backward of this layer has run (``cache.fold.done``). Both backward modes use this one object,
    so ordinary and layerwise steps run the same kernels on the same rows.
    """

    def __init__(self, mod: ModuleType, cache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 rows: RowIdentity, starts: np.ndarray, grad: bool) -> None:
        self.cache, self.rows, self.starts = cache, rows, starts
        with torch.enable_grad() if grad else torch.no_grad():
            self.q = q.detach().requires_grad_(grad)
            self.o = mod.attention(self.q, k.detach(), v.detach(), rows, cache)

    def backward_q(self, do: torch.Tensor) -> torch.Tensor:
        """dQ of this call's rows; this call's query tiles join the layer's dK/dV fold."""
        torch.autograd.backward(self.o, do)
        dq, self.q, self.o = self.q.grad, None, None
        return dq

    def kv_grads(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """dK, dV of this call's rows (pads and fillers: zero), from the layer's completed fold, rounded once."""
        if not self.cache.fold.done:
            raise RuntimeError("attention: dK/dV are not final before every call's attention backward of the layer "
                               "has run; a step of several calls needs the layerwise backward (ChainContext mode "
                               "'auto' or 'layerwise')")
        sample, position = self.rows.sample, self.rows.position
        real = torch.nonzero(sample >= 0)[:, 0]
        token = torch.as_tensor(self.starts)[sample[real]] + position[real]
        out = []
        for full in self.cache.finish():
            g = torch.zeros((sample.shape[0], *full.shape[1:]), dtype=dtype, device=full.device)
            g[real.to(full.device)] = full.index_select(0, token.to(full.device)).to(dtype)
            out.append(g)
        return out[0], out[1]
