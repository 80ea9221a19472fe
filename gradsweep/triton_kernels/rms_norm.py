"""RMSNorm: y = x * rsqrt(mean(x^2) + eps) * weight, FP32 math inside, batch-invariant.

Forward and dx are row-wise, in a launch configuration pinned by the hidden size. The backward is one
pass over (x, dy) per canonical tile of TILE tokens: it writes dx of the call's own rows and one FP32
dweight partial per tile (rows summed in slot order); a sequential fold kernel then adds the partials,
tile after tile, into fold.main_grad. Rows carried from an earlier call (their dx already written)
only feed the partials; this call's rows that are not folded now (pads, rows of incomplete tiles) get
their dx from a second launch of the same kernel that writes no partial.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels._common import (
    fold_partials,
    folded_row_mask,
    leftover_table,
    own_rows_table,
    require_fold,
    row_config,
    to_out,
)

TILE: int = 32
BWD_STAGES = 3  # software-pipelining depth of the backward's row loop (speed only, not bits)


@triton.jit
def _rms_fwd_kernel(x_ptr, w_ptr, y_ptr, n_rows, H, eps,
                    BLOCK: tl.constexpr, ROWS: tl.constexpr):
    pid = tl.program_id(0)
    r = pid.to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    m = (r < n_rows)[:, None] & cmask[None, :]
    off = r[:, None] * H + cols[None, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
    y = x * rstd[:, None] * w[None, :]
    tl.store(y_ptr + off, to_out(y, y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _rms_bwd_kernel(work_ptr, x_ptr, dy_ptr, w_ptr, dx_ptr, part_ptr, n_carried, H, eps,
                    TILE: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr,
                    FOLD: tl.constexpr, STORE_DX: tl.constexpr):
    """One work tile: rows work[t, :] of the source tensors (-1 = zero row).

    Partial order (fixed by TILE and ROWS alone): slot j feeds lane j % ROWS, lanes accumulate in
    slot order, then the ROWS lanes are summed once at the end.
    """
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    # A pipelined loop (cp.async prefetch of the next rows while this one is reduced); a static_range
    # unroll would make ptxas spill.
    for j0 in tl.range(0, TILE, ROWS, num_stages=STAGES):
        idx = tl.load(work_ptr + t * TILE + j0 + tl.arange(0, ROWS)).to(tl.int64)
        valid = idx >= 0
        m = valid[:, None] & cmask[None, :]
        off = tl.maximum(idx, 0)[:, None] * H + cols[None, :]
        x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / H + eps)
        xhat = x * rstd[:, None]
        if STORE_DX:
            g = dy * w[None, :]
            c = tl.sum(g * xhat, axis=1) / H
            dx = rstd[:, None] * (g - xhat * c[:, None])
            own = valid & (idx >= n_carried)
            doff = tl.maximum(idx - n_carried, 0)[:, None] * H + cols[None, :]
            tl.store(dx_ptr + doff, to_out(dx, dx_ptr.dtype.element_ty), mask=own[:, None] & cmask[None, :])
        if FOLD:
            acc += dy * xhat
    if FOLD:
        tl.store(part_ptr + t * H + cols, tl.sum(acc, axis=0), mask=cmask)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Row-wise forward launcher (no autograd)."""
    n_rows, hidden = x.shape
    x = x.contiguous()
    y = torch.empty_like(x)
    if n_rows == 0 or hidden == 0:
        return y
    block, rows, warps = row_config(hidden, TILE)
    _rms_fwd_kernel[(triton.cdiv(n_rows, rows),)](x, weight.contiguous(), y, n_rows, hidden, float(eps),
                                                  BLOCK=block, ROWS=rows, num_warps=warps)
    return y


def _launch_bwd(work: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, weight: torch.Tensor,
                dx: torch.Tensor, partials: torch.Tensor, n_carried: int, eps: float, fold: bool,
                store_dx: bool) -> None:
    if work.shape[0] == 0:
        return
    hidden = x.shape[1]
    block, rows, warps = row_config(hidden, TILE)
    _rms_bwd_kernel[(work.shape[0],)](work, x, dy, weight, dx, partials, n_carried, hidden, float(eps),
                                      TILE=TILE, BLOCK=block, ROWS=rows, STAGES=BWD_STAGES, FOLD=fold,
                                      STORE_DX=store_dx, num_warps=warps)


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, eps: float,
                      rows: RowIdentity | None, fold: CanonicalFold | None,
                      need_dx: bool = True) -> torch.Tensor | None:
    """dx of this call's rows; dweight folded into fold.main_grad in canonical order (no autograd)."""
    n_rows, hidden = x.shape
    dy = dy.contiguous()
    dx = torch.empty_like(x) if need_dx else None
    dx_arg = dx if dx is not None else x
    empty = torch.empty(0, dtype=torch.float32, device=x.device)
    if fold is None:
        if need_dx and n_rows and hidden:
            _launch_bwd(own_rows_table(n_rows, TILE, x.device), x, dy, weight, dx_arg, empty, 0, eps,
                        fold=False, store_dx=True)
        return dx
    if rows is None or rows.num_rows != n_rows:
        raise ValueError("rms_norm: rows must describe every row of x")
    if fold.tile != TILE:
        raise ValueError(f"rms_norm: fold.tile must be rms_norm.TILE={TILE}, got {fold.tile}")
    first = fold.cursor
    step = fold.take(rows, (x, dy))
    src_x, src_dy = step.tensors
    n_carried = src_x.shape[0] - n_rows
    if hidden and step.num_tiles:
        partials = torch.empty((step.num_tiles, hidden), dtype=torch.float32, device=x.device)
        _launch_bwd(step.plan, src_x, src_dy, weight, dx_arg, partials, n_carried, eps,
                    fold=True, store_dx=need_dx)
        fold_partials(partials, fold.main_grad.view(-1))
    if need_dx and n_rows and hidden:
        covered = folded_row_mask(rows, fold, first, step.num_tiles)
        rest = leftover_table(np.nonzero(~covered)[0], n_carried, TILE, x.device)
        if rest is not None:
            _launch_bwd(rest, src_x, src_dy, weight, dx_arg, empty, n_carried, eps,
                        fold=False, store_dx=True)
    return dx


class _RMSNormFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps, rows, fold):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.eps, ctx.rows, ctx.fold = eps, rows, fold
        return rms_norm_forward(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        dx = rms_norm_backward(x, weight, dy, ctx.eps, ctx.rows, ctx.fold, need_dx=ctx.needs_input_grad[0])
        return dx, None, None, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows: RowIdentity,
             fold: CanonicalFold | None) -> torch.Tensor:
    """RMSNorm of x [R, H] (bf16 in/out); dweight goes into fold.main_grad (returned grad is None)."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"rms_norm: expected x [R, H] and weight [H], got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    require_fold(fold, weight, "rms_norm")
    return _RMSNormFn.apply(x.contiguous(), weight, eps, rows, fold)
