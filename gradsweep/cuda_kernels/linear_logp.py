"""Fused lm_head + selected-token log-prob that never materialises the [R, V] logits (gradsweep._C).

Forward (csrc/linear_logp.cu): CTA (128-row tile, vocabulary chunk of ``_C.LLP_VCHUNK`` columns) computes
logits blocks [128, 128] with the tensor-core mainloop and folds each into a per-row online log-sum-exp in a
fixed order; a second kernel combines the chunks in chunk order. The launch configuration is a constant
(nothing about R enters it), so a row's bits never depend on the batch.

Backward: the vocabulary is walked in chunks of ``BWD_VCHUNK`` columns. Per chunk, a GEMM with an
element-wise epilogue recomputes dlogits = g (onehot - exp(logit - lse)) in bf16 [S, chunk] (peak extra
memory O(R x chunk)); dhidden accumulates chunk after chunk in an fp32 buffer that each GEMM loads (one
sequential order over V); the chunk's dW rows are folded into ``fold.main_grad`` by the canonical fold
kernel. Rows the fold carries from an earlier call are recomputed from their saved (hidden, target, lse, g).

Targets outside [0, V) give logp 0 and zero gradients. Same public API as the Triton twin.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import runtime as rt
from gradsweep.cuda_kernels.gemm import TILE, dw_fold_raw, matmul_accumulate
from gradsweep.kernel_api import check_linear_logp, logp_outputs, require_fold

__all__ = ["TILE", "linear_logp"]
# Backward vocabulary chunk: extra memory O(R x BWD_VCHUNK); the bits do not follow it (a multiple of 16).
BWD_VCHUNK = 8192


def fused_forward(hidden: torch.Tensor, weight: torch.Tensor,
                  targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp fp32 [R], lse fp32 [R]) without materialising logits."""
    r, k = hidden.shape
    v = weight.shape[0]
    out, lse = logp_outputs(r, v, hidden.device, "linear_logp")
    if r == 0:
        return out, lse
    ext = rt.ext()
    n_chunks = -(-v // int(ext.LLP_VCHUNK))
    part = torch.empty(3 * n_chunks * r, dtype=torch.float32, device=hidden.device)
    dev, stream = rt.launch(hidden)
    ext.llp_forward(rt.ptr(hidden), rt.ptr(weight), rt.ptr(targets), rt.ptr(part), rt.ptr(out), rt.ptr(lse), r, v,
                    k, hidden.stride(0), weight.stride(0), dev, stream)
    return out, lse


def dlogits_chunk(hidden: torch.Tensor, w_chunk: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                  g: torch.Tensor, v0: int, vocab: int) -> torch.Tensor:
    """bf16 dlogits [S, chunk] of vocabulary columns v0 .. v0 + chunk - 1 (recomputed logits)."""
    m, k = hidden.shape
    n = w_chunk.shape[0]
    d = torch.empty(m, n, dtype=hidden.dtype, device=hidden.device)
    if m == 0 or n == 0:
        return d
    dev, stream = rt.launch(hidden)
    rt.ext().llp_dlogits(rt.ptr(hidden), rt.ptr(w_chunk), rt.ptr(targets), rt.ptr(lse), rt.ptr(g), rt.ptr(d), m, n,
                         k, v0, vocab, hidden.stride(0), w_chunk.stride(0), d.stride(0), dev, stream)
    return d


class LinearLogpFn(torch.autograd.Function):
    """Fused lm_head + selected logp; backward recomputes logits chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, fold):  # type: ignore[override]
        out, lse = fused_forward(hidden, weight, targets)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.rows, ctx.fold = rows, fold
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = g.float().contiguous()
        r, k = hidden.shape
        v = weight.shape[0]
        src, n_pend, plan = (hidden, targets, lse, g), 0, None
        if need_w:
            if ctx.fold is None:
                raise ValueError("linear_logp backward: weight requires grad but fold is None")
            step = ctx.fold.take(ctx.rows, src)
            if step.num_tiles > 0:
                src = tuple(t.contiguous() for t in step.tensors)
                n_pend, plan = src[0].shape[0] - r, step.plan
        dh_acc = torch.zeros(r, k, dtype=torch.float32, device=hidden.device) if need_h else None
        if plan is not None or (need_h and r > 0):
            for v0 in range(0, v, BWD_VCHUNK):
                w_c = weight[v0:v0 + BWD_VCHUNK]
                d = dlogits_chunk(src[0], w_c, src[1], src[2], src[3], v0, v)
                if dh_acc is not None:
                    matmul_accumulate(d[n_pend:], w_c, dh_acc)
                if plan is not None:
                    dw_fold_raw(plan, src[0], d, ctx.fold.main_grad[v0:v0 + w_c.shape[0]])
        dh = dh_acc.to(hidden.dtype) if dh_acc is not None else None
        return dh, None, None, None, None


def linear_logp(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: RowIdentity,
                fold: CanonicalFold | None) -> torch.Tensor:
    """logp[r] = z[r, t_r] - logsumexp_v z[r, v] with z = hidden @ weight^T; fp32 [R], batch-invariant."""
    check_linear_logp(hidden, weight, targets, rows)
    rt.check_tensor("linear_logp hidden", hidden)
    rt.check_tensor("linear_logp weight", weight)
    require_fold(fold, weight, "linear_logp")
    targets = targets.to(device=hidden.device, dtype=torch.int64).contiguous()
    return LinearLogpFn.apply(hidden.contiguous(), weight.contiguous(), targets, rows, fold)
