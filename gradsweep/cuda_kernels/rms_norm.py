"""RMSNorm (gradsweep._C): y = x * rsqrt(mean(x^2) + eps) * weight, bf16 in/out, FP32 math inside.

Forward and dx are row-wise, one CUDA block per row with a block size set by H alone (for H <= 256 one warp
per row, several rows per block, with the one-warp block's lane map and reduction: the same bits), so a row's
bits never depend on how many rows share the call. dweight follows the canonical protocol: the backward calls
``fold.take(rows, (dy, x, rstd))`` and launches two kernels on the returned plan: per-tile sums (rows in
slot order; rows carried from earlier calls read in place from the fold's staging, beside this call's) then a
sequential fold of those sums, tile after tile, into fold.main_grad (loaded by the kernel, stored back). The
weight's returned gradient is None: the trainer reads fold.main_grad.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import runtime as rt
from gradsweep.cuda_kernels.stage_copy import copy_pieces
from gradsweep.kernel_api import check_rms_norm, require_fold, run_function

TILE: int = 64


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, rstd): y bf16 [R, H], rstd fp32 [R] (saved for the backward)."""
    n_rows, hidden = x.shape
    y = torch.empty_like(x)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    if n_rows and hidden:
        dev, stream = rt.launch(x)
        rt.ext().rms_norm_fwd(rt.ptr(x), rt.ptr(weight), rt.ptr(y), rt.ptr(rstd), n_rows, hidden, float(eps),
                              dev, stream)
    return y, rstd


def rms_norm_dx(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """dx bf16 [R, H], row-wise."""
    n_rows, hidden = x.shape
    dx = torch.empty_like(x)
    if n_rows and hidden:
        dev, stream = rt.launch(x)
        rt.ext().rms_norm_bwd_dx(rt.ptr(dy), rt.ptr(x), rt.ptr(weight), rt.ptr(rstd), rt.ptr(dx), n_rows,
                                 hidden, dev, stream)
    return dx


def rms_norm_fold_dweight(dy: torch.Tensor, x: torch.Tensor, rstd: torch.Tensor, rows: RowIdentity,
                          fold: CanonicalFold) -> None:
    """Fold this call's dweight contributions into fold.main_grad in canonical order."""
    hidden = x.shape[1]
    step = fold.take(rows, (dy, x, rstd), stage_copy=copy_pieces)
    if step.num_tiles == 0 or hidden == 0:
        return
    # (carried rows, this call's rows) of dy, x and rstd: the carried rows are read in place, never concatenated
    (dy_st, dy_c), (x_st, x_c), (r_st, r_c) = ((s.contiguous(), c.contiguous()) for s, c in step.bases)
    plan = rt.like(step.plan, x, torch.int32)
    partial = torch.empty((step.num_tiles, hidden), dtype=torch.float32, device=x.device)
    dev, stream = rt.launch(x)
    ext = rt.ext()
    ext.rms_norm_dw_tiles(rt.ptr(plan), step.num_tiles, int(plan.shape[1]), rt.ptr(dy_c), rt.ptr(x_c),
                          rt.ptr(r_c), rt.ptr(partial), hidden, dev, stream, stage_dy=rt.ptr(dy_st),
                          stage_x=rt.ptr(x_st), stage_rstd=rt.ptr(r_st), n_stage=step.n_stage)
    ext.fold_tiles(rt.ptr(partial), step.num_tiles, rt.ptr(fold.main_grad), hidden, dev, stream)


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, rows, fold):  # type: ignore[override]
        y, rstd = rms_norm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.rows, ctx.fold = rows, fold
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        dy = dy.to(torch.bfloat16).contiguous()
        dx = rms_norm_dx(dy, x, weight, rstd) if ctx.needs_input_grad[0] else None
        if ctx.fold is not None:
            rms_norm_fold_dweight(dy, x, rstd, ctx.rows, ctx.fold)
        return dx, None, None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows: RowIdentity | None,
             fold: CanonicalFold | None) -> torch.Tensor:
    """RMSNorm of x [R, H] (bf16, CUDA); differentiable in x; dweight goes to fold.main_grad (grad None)."""
    check_rms_norm(x, weight)
    rt.check_tensor("rms_norm x", x)
    rt.check_tensor("rms_norm weight", weight)
    if weight.device != x.device:
        raise ValueError(f"rms_norm: x on {x.device}, weight on {weight.device}")
    require_fold(fold, weight, "rms_norm")
    if fold is not None and (rows is None or rows.num_rows != x.shape[0]):
        raise ValueError("rms_norm: rows must give the logical identity of every row of x")
    return run_function(_RMSNormFn, x.contiguous(), weight.contiguous(), float(eps), rows, fold)
