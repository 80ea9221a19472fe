"""QK-norm (gradsweep._C): RMSNorm of every head of x [R, heads, head_dim] over head_dim, one weight [head_dim].

Forward and dx are rms_norm's row kernels on the [R * heads, head_dim] view (one warp per (token, head) for
head_dim <= 256, its lane map and reduction a function of head_dim alone), so a row's bits never depend on the
batch. dweight follows the
canonical protocol: ``fold.take(rows, (dy, x, rstd))`` gives the plan; one kernel writes one fp32 partial
per canonical tile (the tile's (token, head) pairs in (slot, head) order dealt to a head_dim-fixed number of
streams, each summed in order, then the streams in order; -1 slots skipped) and rms_norm's fold kernel adds the
partials tile after tile into the loaded fold.main_grad.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import runtime as rt
from gradsweep.cuda_kernels.rms_norm import rms_norm_dx, rms_norm_forward
from gradsweep.cuda_kernels.stage_copy import copy_pieces
from gradsweep.kernel_api import check_qk_norm, require_fold, run_function

TILE: int = 32


def _forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    n_rows, heads, head_dim = x.shape
    y, rstd = rms_norm_forward(x.reshape(n_rows * heads, head_dim), weight, eps)
    return y.view(n_rows, heads, head_dim), rstd.view(n_rows, heads)


def qk_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm forward launcher (no autograd)."""
    return _forward(x.contiguous(), weight.contiguous(), eps)[0]


def _fold_dweight(x: torch.Tensor, dy: torch.Tensor, rstd: torch.Tensor, rows: RowIdentity,
                  fold: CanonicalFold) -> None:
    _, heads, head_dim = x.shape
    step = fold.take(rows, (dy, x, rstd), stage_copy=copy_pieces)
    if step.num_tiles == 0 or head_dim == 0:
        return
    # (carried rows, this call's rows) of dy, x and rstd: the carried rows are read in place, never concatenated
    (dy_st, dy_c), (x_st, x_c), (r_st, r_c) = ((s.contiguous(), c.contiguous()) for s, c in step.bases)
    plan = rt.like(step.plan, x, torch.int32)
    partial = torch.empty((step.num_tiles, head_dim), dtype=torch.float32, device=x.device)
    dev, stream = rt.launch(x)
    ext = rt.ext()
    ext.qk_norm_dw_tiles(rt.ptr(plan), step.num_tiles, int(plan.shape[1]), rt.ptr(dy_c), rt.ptr(x_c), rt.ptr(r_c),
                         rt.ptr(partial), heads, head_dim, dev, stream, stage_dy=rt.ptr(dy_st), stage_x=rt.ptr(x_st),
                         stage_rstd=rt.ptr(r_st), n_stage=step.n_stage)
    ext.fold_tiles(rt.ptr(partial), step.num_tiles, rt.ptr(fold.main_grad), head_dim, dev, stream)


def qk_norm_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, eps: float,
                     rows: RowIdentity | None, fold: CanonicalFold | None, need_dx: bool = True,
                     rstd: torch.Tensor | None = None) -> torch.Tensor | None:
    """dx of this call's tokens; dweight folded into fold.main_grad in canonical order (no autograd).

    ``rstd`` [R, heads] is the forward's (recomputed when not given).
    """
    x = x.contiguous()
    dy = dy.to(torch.bfloat16).contiguous()
    n_rows, heads, head_dim = x.shape
    if rstd is None:
        rstd = _forward(x, weight.contiguous(), eps)[1]
    dx = None
    if need_dx:
        dx = rms_norm_dx(dy.view(n_rows * heads, head_dim), x.view(n_rows * heads, head_dim), weight.contiguous(),
                         rstd.reshape(-1)).view_as(x)
    if fold is not None:
        if rows is None or rows.num_rows != n_rows:
            raise ValueError("qk_norm: rows must describe every row of x")
        _fold_dweight(x, dy, rstd, rows, fold)
    return dx


class _QKNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, rows, fold):  # type: ignore[override]
        y, rstd = _forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.eps, ctx.rows, ctx.fold = eps, rows, fold
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        dx = qk_norm_backward(x, weight, dy, ctx.eps, ctx.rows, ctx.fold, need_dx=ctx.needs_input_grad[0],
                              rstd=rstd)
        return dx, None, None, None, None


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows: RowIdentity,
            fold: CanonicalFold | None) -> torch.Tensor:
    """Per-head RMSNorm of x [R, heads, head_dim]; dweight goes into fold.main_grad (returned grad None)."""
    check_qk_norm(x, weight)
    rt.check_tensor("qk_norm x", x)
    rt.check_tensor("qk_norm weight", weight)
    if weight.device != x.device:
        raise ValueError(f"qk_norm: x on {x.device}, weight on {weight.device}")
    require_fold(fold, weight, "qk_norm")
    return run_function(_QKNormFn, x.contiguous(), weight.contiguous(), float(eps), rows, fold)
