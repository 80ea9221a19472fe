"""Fused lm_head + selected-token log-prob that never materialises the [R, V] logits (gradsweep._C).

Forward (csrc/linear_logp.cu): CTA (128-row tile, vocabulary chunk of ``_C.LLP_VCHUNK`` columns) computes
logits blocks [128, 128] with the tensor-core mainloop and folds each into a per-row online log-sum-exp in a
fixed order; a second kernel combines the chunks in chunk order. The launch configuration is a constant
(nothing about R enters it), so a row's bits never depend on the batch.

On Hopper (``_C.hopper_gemm``) the logits of a vocabulary slab go through an fp32 scratch instead of registers:
the CUTLASS GEMM writes the accumulators, a row-local kernel runs the same reduction on them (same bits as the
mma.sync kernel; ``SCRATCH_BYTES`` bounds the scratch, and its width follows R, never the bits).

Backward: the vocabulary is walked in chunks of ``BWD_VCHUNK`` columns. Per chunk, a GEMM with an
element-wise epilogue recomputes dlogits = g (onehot - exp(logit - lse)) in bf16 [S, chunk] (peak extra
memory O(R x chunk)); dhidden is the fp32 sum, chunk after chunk, of each chunk's product dlogits @ W_chunk
(rounded once, ``matmul_add``: the chunk width is part of the arithmetic, hence one constant); the chunk's dW
rows are folded into ``fold.main_grad`` by the canonical fold kernel. Rows the fold carries from an earlier
call are recomputed from their saved (hidden, target, lse, g).

Targets outside [0, V) give logp 0 and zero gradients. Same public API as the Triton twin.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import runtime as rt
from gradsweep.cuda_kernels.gemm import TILE, dw_fold_raw, matmul_add
from gradsweep.cuda_kernels.stage_copy import copy_pieces
from gradsweep.kernel_api import check_linear_logp, logp_outputs, require_fold, run_function

__all__ = ["TILE", "linear_logp"]
# Backward vocabulary chunk: extra memory O(R x BWD_VCHUNK); dhidden sums one product per chunk, so the width is
# part of the bits: a constant (never a function of R or of the device).
BWD_VCHUNK = 4096
# Bound of the Hopper path's fp32 logits scratch (the forward's slab is the widest whole number of
# LLP_VCHUNK-column chunks within it, at least one).
SCRATCH_BYTES = 256 << 20


def forward_scratch(rows: int, vocab: int, like: torch.Tensor, device: int) -> tuple[torch.Tensor | None, int]:
    """(fp32 logits scratch, its columns) of the Hopper forward on CUDA device ``device``; (None, 0) where the
    mma.sync kernel runs (not a Hopper device, or a vocabulary whose slabs TMA cannot store by rows: the launcher
    decides, this only spares the allocation)."""
    if vocab % 4 or not rt.ext().hopper_gemm(device):
        return None, 0
    chunk = int(rt.ext().LLP_VCHUNK)
    cols = max(1, min(-(-vocab // chunk), SCRATCH_BYTES // (4 * chunk * max(rows, 1)))) * chunk
    return torch.empty(rows * cols, dtype=torch.float32, device=like.device), cols


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
    logits, cols = forward_scratch(r, v, hidden, dev)
    ext.llp_forward(rt.ptr(hidden), rt.ptr(weight), rt.ptr(targets), rt.ptr(part), rt.ptr(out), rt.ptr(lse), r, v,
                    k, hidden.stride(0), weight.stride(0), rt.ptr(logits), cols, dev, stream)
    return out, lse


def dlogits_scratch(rows: int, like: torch.Tensor) -> torch.Tensor | None:
    """The fp32 logits scratch of every ``dlogits_chunk`` of one backward ([rows, BWD_VCHUNK]; None off Hopper):
    allocated once per backward, not once per chunk."""
    if rows == 0 or not rt.ext().hopper_gemm(rt.launch(like)[0]):
        return None
    return torch.empty(rows * BWD_VCHUNK, dtype=torch.float32, device=like.device)


def dlogits_chunk(hidden: torch.Tensor, w_chunk: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                  g: torch.Tensor, v0: int, vocab: int, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """bf16 dlogits [S, chunk] of vocabulary columns v0 .. v0 + chunk - 1 (recomputed logits); ``scratch`` (from
    ``dlogits_scratch``, chunk <= BWD_VCHUNK) lets the Hopper GEMM write the chunk's fp32 logits first."""
    m, k = hidden.shape
    n = w_chunk.shape[0]
    d = torch.empty(m, n, dtype=hidden.dtype, device=hidden.device)
    if m == 0 or n == 0:
        return d
    cols = -(-n // 8) * 8
    logits = scratch if scratch is not None and n % 4 == 0 and scratch.numel() >= m * cols else None
    dev, stream = rt.launch(hidden)
    rt.ext().llp_dlogits(rt.ptr(hidden), rt.ptr(w_chunk), rt.ptr(targets), rt.ptr(lse), rt.ptr(g), rt.ptr(d), m, n,
                         k, v0, vocab, hidden.stride(0), w_chunk.stride(0), d.stride(0), rt.ptr(logits), cols, dev,
                         stream)
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
            step = ctx.fold.take(ctx.rows, src, stage_copy=copy_pieces)
            if step.num_tiles > 0:
                src = tuple(t.contiguous() for t in step.tensors)
                n_pend, plan = src[0].shape[0] - r, step.plan
        dh_acc = torch.zeros(r, k, dtype=torch.float32, device=hidden.device) if need_h else None
        if plan is not None or (need_h and r > 0):
            scratch = dlogits_scratch(src[0].shape[0], hidden)
            for v0 in range(0, v, BWD_VCHUNK):
                w_c = weight[v0:v0 + BWD_VCHUNK]
                d = dlogits_chunk(src[0], w_c, src[1], src[2], src[3], v0, v, scratch)
                if dh_acc is not None:
                    matmul_add(d[n_pend:], w_c, dh_acc)
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
    return run_function(LinearLogpFn, hidden.contiguous(), weight.contiguous(), targets, rows, fold)
