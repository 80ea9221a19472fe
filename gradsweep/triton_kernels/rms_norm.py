"""RMSNorm: y = x * rsqrt(mean(x^2) + eps) * weight, FP32 math inside, batch-invariant.

Forward and dx are row-wise, in a launch configuration pinned by the hidden size. The backward is one
pass over (x, dy) per canonical tile of TILE tokens: it writes dx of the call's own rows and one FP32
dweight partial per tile (rows summed in slot order); a sequential fold kernel then adds the partials,
tile after tile, into fold.main_grad. Tiles are described by ``(row0, count)``: read in
place from this call's rows (dx stored), or from the fold's staging rows (carried from an earlier call or
split across calls: read only); this call's rows that no in-place tile covers (pads, staged rows, rows of
incomplete tiles) get their dx from a second launch of the same kernel that writes no partial.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.kernel_api import check_rms_norm, require_fold, run_function
from gradsweep.triton_kernels._common import FastLaunch, cdiv, norm_backward, norm_function, row_config, to_out

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
def _rms_bwd_kernel(desc_ptr, x_ptr, dy_ptr, xs_ptr, dys_ptr, w_ptr, dx_ptr, part_ptr, H, eps,
                    TILE: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, STAGES: tl.constexpr,
                    FOLD: tl.constexpr, STORE_DX: tl.constexpr):
    """One work tile ``desc[t] = (row0, count)``: slots 0..count-1 are rows row0.. of x / dy (their dx is
    stored), or rows -row0-1.. of the staging xs / dys when row0 < 0 (read only); other slots are zero rows.

    Partial order (fixed by TILE and ROWS alone): slot j feeds lane j % ROWS, lanes accumulate in
    slot order, then the ROWS lanes are summed once at the end.
    """
    t = tl.program_id(0).to(tl.int64)
    row0 = tl.load(desc_ptr + 2 * t)
    count = tl.load(desc_ptr + 2 * t + 1)
    staged = row0 < 0
    first = tl.where(staged, -row0 - 1, row0).to(tl.int64)
    xb = tl.where(staged, xs_ptr, x_ptr)
    dyb = tl.where(staged, dys_ptr, dy_ptr)
    cols = tl.arange(0, BLOCK)
    cmask = cols < H
    w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    # A pipelined loop (cp.async prefetch of the next rows while this one is reduced); a static_range
    # unroll would make ptxas spill.
    for j0 in tl.range(0, TILE, ROWS, num_stages=STAGES):
        j = j0 + tl.arange(0, ROWS)
        valid = j < count
        m = valid[:, None] & cmask[None, :]
        off = (first + j)[:, None] * H + cols[None, :]
        x = tl.load(xb + off, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dyb + off, mask=m, other=0.0).to(tl.float32)
        # zero rows give xhat = 0 even when eps = 0 (rsqrt(0) = inf, and 0 * inf is NaN)
        rstd = tl.where(valid, tl.rsqrt(tl.sum(x * x, axis=1) / H + eps), 0.0)
        xhat = x * rstd[:, None]
        if STORE_DX:
            g = dy * w[None, :]
            c = tl.sum(g * xhat, axis=1) / H
            dx = rstd[:, None] * (g - xhat * c[:, None])
            own = tl.where(staged, False, valid)  # a where, not a scalar &: triton 3.9's interpreter wants bool masks
            tl.store(dx_ptr + off, to_out(dx, dx_ptr.dtype.element_ty), mask=own[:, None] & cmask[None, :])
        if FOLD:
            acc += dy * xhat
    if FOLD:
        tl.store(part_ptr + t * H + cols, tl.sum(acc, axis=0), mask=cmask)


_FWD = FastLaunch(_rms_fwd_kernel)
_BWD = FastLaunch(_rms_bwd_kernel)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Row-wise forward launcher (no autograd)."""
    n_rows, hidden = x.shape
    x = x.contiguous()
    y = torch.empty_like(x)
    if n_rows == 0 or hidden == 0:
        return y
    block, rows, warps = row_config(hidden, TILE)
    _FWD((cdiv(n_rows, rows),), [x, weight.contiguous(), y, n_rows, hidden, float(eps)],
         {"BLOCK": block, "ROWS": rows}, num_warps=warps)
    return y


def _launch_bwd(desc: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, xs: torch.Tensor, dys: torch.Tensor,
                weight: torch.Tensor, dx: torch.Tensor, partials: torch.Tensor, eps: float, fold: bool,
                store_dx: bool) -> None:
    """The backward kernel over tile descriptors (``TileStep.desc``; xs / dys: the staging tensors)."""
    if desc.shape[0] == 0:
        return
    hidden = x.shape[1]
    block, rows, warps = row_config(hidden, TILE)
    _BWD((desc.shape[0],), [desc, x, dy, xs, dys, weight, dx, partials, hidden, float(eps)],
         {"TILE": TILE, "BLOCK": block, "ROWS": rows, "STAGES": BWD_STAGES, "FOLD": fold, "STORE_DX": store_dx},
         num_warps=warps)


def rms_norm_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, eps: float,
                      rows: RowIdentity | None, fold: CanonicalFold | None,
                      need_dx: bool = True) -> torch.Tensor | None:
    """dx of this call's rows; dweight folded into fold.main_grad in canonical order (no autograd)."""
    launch = functools.partial(_launch_bwd, weight=weight, eps=eps)
    return norm_backward("rms_norm", x, dy, weight, rows, fold, TILE, launch, need_dx)


_RMSNormFn = norm_function(rms_norm_forward, rms_norm_backward)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows: RowIdentity,
             fold: CanonicalFold | None) -> torch.Tensor:
    """RMSNorm of x [R, H] (bf16 in/out); dweight goes into fold.main_grad (returned grad is None)."""
    check_rms_norm(x, weight)
    require_fold(fold, weight, "rms_norm")
    return run_function(_RMSNormFn, x.contiguous(), weight, eps, rows, fold)
