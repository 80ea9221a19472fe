"""QK-norm: RMSNorm of every head of x [R, heads, head_dim] over head_dim, one shared weight [head_dim].

Same scheme as rms_norm: forward and dx row-wise (TOK tokens per [TOK, heads, head_dim] block, a shape
that depends on the feature sizes only); dweight reduces over the heads of a token (fixed
order, pinned block) then over the TILE tokens of a canonical tile in slot order, and the per-tile
partials are folded sequentially into fold.main_grad.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.kernel_api import check_qk_norm, require_fold, run_function
from gradsweep.triton_kernels._common import FastLaunch, cdiv, norm_backward, norm_function, pow2, to_out, warps_for

TILE: int = 32
BWD_STAGES = 3  # software-pipelining depth of the backward's token loop (speed only, not bits)


def _config(heads: int, head_dim: int) -> tuple[int, int, int, int]:
    """Pinned (TOKENS per block, BLOCK_HEADS, BLOCK_D, num_warps): feature sizes only."""
    bh, bd = pow2(heads), pow2(head_dim)
    tok = max(1, min(TILE, 2048 // (bh * bd)))
    return tok, bh, bd, warps_for(tok * bh * bd)


@triton.jit
def _qk_fwd_kernel(x_ptr, w_ptr, y_ptr, n_rows, NH, D, eps,
                   TOK: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * TOK + tl.arange(0, TOK)
    h = tl.arange(0, BH)
    d = tl.arange(0, BD)
    m = (r < n_rows)[:, None, None] & ((h < NH)[:, None] & (d < D)[None, :])[None, :, :]
    off = r[:, None, None] * NH * D + (h[:, None] * D + d[None, :])[None, :, :]
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=2) / D + eps)
    y = x * rstd[:, :, None] * w[None, None, :]
    tl.store(y_ptr + off, to_out(y, y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _qk_bwd_kernel(desc_ptr, x_ptr, dy_ptr, xs_ptr, dys_ptr, w_ptr, dx_ptr, part_ptr, NH, D, eps,
                   TILE: tl.constexpr, TOK: tl.constexpr, BH: tl.constexpr, BD: tl.constexpr,
                   STAGES: tl.constexpr, FOLD: tl.constexpr, STORE_DX: tl.constexpr):
    """One work tile ``desc[t] = (row0, count)`` of TILE token slots (rows of x / dy, or of the staging
    xs / dys when row0 < 0; slots past count are zero tokens): TOK tokens at a time, in slot order."""
    t = tl.program_id(0).to(tl.int64)
    row0 = tl.load(desc_ptr + 2 * t)
    count = tl.load(desc_ptr + 2 * t + 1)
    staged = row0 < 0
    first = tl.where(staged, -row0 - 1, row0).to(tl.int64)
    xb = tl.where(staged, xs_ptr, x_ptr)
    dyb = tl.where(staged, dys_ptr, dy_ptr)
    h = tl.arange(0, BH)
    d = tl.arange(0, BD)
    fm = ((h < NH)[:, None] & (d < D)[None, :])[None, :, :]
    inner = (h[:, None] * D + d[None, :])[None, :, :]
    w = tl.load(w_ptr + d, mask=d < D, other=0.0).to(tl.float32)
    acc = tl.zeros([TOK, BH, BD], dtype=tl.float32)
    for j0 in tl.range(0, TILE, TOK, num_stages=STAGES):  # pipelined; a static unroll would spill
        j = j0 + tl.arange(0, TOK)
        valid = j < count
        m = fm & valid[:, None, None]
        off = (first + j)[:, None, None] * NH * D + inner
        x = tl.load(xb + off, mask=m, other=0.0).to(tl.float32)
        dy = tl.load(dyb + off, mask=m, other=0.0).to(tl.float32)
        # zero tokens and padded heads give xhat = 0 even when eps = 0 (rsqrt(0) = inf, and 0 * inf is NaN)
        rstd = tl.where(valid[:, None] & (h < NH)[None, :], tl.rsqrt(tl.sum(x * x, axis=2) / D + eps), 0.0)
        xhat = x * rstd[:, :, None]
        if STORE_DX:
            g = dy * w[None, None, :]
            c = tl.sum(g * xhat, axis=2) / D
            dx = rstd[:, :, None] * (g - xhat * c[:, :, None])
            own = tl.where(staged, False, valid)  # a where, not a scalar &: triton 3.9's interpreter wants bool masks
            tl.store(dx_ptr + off, to_out(dx, dx_ptr.dtype.element_ty), mask=fm & own[:, None, None])
        if FOLD:
            acc += dy * xhat
    if FOLD:  # fixed order: lanes (token slot % TOK, head) accumulate in slot order, then summed once
        tl.store(part_ptr + t * D + d, tl.sum(tl.sum(acc, axis=1), axis=0), mask=d < D)


_FWD = FastLaunch(_qk_fwd_kernel)
_BWD = FastLaunch(_qk_bwd_kernel)


def qk_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-head RMSNorm forward launcher (no autograd)."""
    n_rows, heads, head_dim = x.shape
    x = x.contiguous()
    y = torch.empty_like(x)
    if y.numel() == 0:
        return y
    tok, bh, bd, warps = _config(heads, head_dim)
    _FWD((cdiv(n_rows, tok),), [x, weight.contiguous(), y, n_rows, heads, head_dim, float(eps)],
         {"TOK": tok, "BH": bh, "BD": bd}, num_warps=warps)
    return y


def _launch_bwd(desc: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, xs: torch.Tensor, dys: torch.Tensor,
                weight: torch.Tensor, dx: torch.Tensor, partials: torch.Tensor, eps: float, fold: bool,
                store_dx: bool) -> None:
    """The backward kernel over tile descriptors (``TileStep.desc``; xs / dys: the staging tensors)."""
    if desc.shape[0] == 0:
        return
    _, heads, head_dim = x.shape
    tok, bh, bd, warps = _config(heads, head_dim)
    _BWD((desc.shape[0],), [desc, x, dy, xs, dys, weight, dx, partials, heads, head_dim, float(eps)],
         {"TILE": TILE, "TOK": tok, "BH": bh, "BD": bd, "STAGES": BWD_STAGES, "FOLD": fold, "STORE_DX": store_dx},
         num_warps=warps)


def qk_norm_backward(x: torch.Tensor, weight: torch.Tensor, dy: torch.Tensor, eps: float,
                     rows: RowIdentity | None, fold: CanonicalFold | None,
                     need_dx: bool = True) -> torch.Tensor | None:
    """dx of this call's tokens; dweight folded into fold.main_grad in canonical order (no autograd)."""
    launch = functools.partial(_launch_bwd, weight=weight, eps=eps)
    return norm_backward("qk_norm", x, dy, weight, rows, fold, TILE, launch, need_dx)


_QKNormFn = norm_function(qk_norm_forward, qk_norm_backward)


def qk_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, rows: RowIdentity,
            fold: CanonicalFold | None) -> torch.Tensor:
    """Per-head RMSNorm of x [R, heads, head_dim]; dweight goes into fold.main_grad (returned grad None)."""
    check_qk_norm(x, weight)
    require_fold(fold, weight, "qk_norm")
    return run_function(_QKNormFn, x.contiguous(), weight, eps, rows, fold)
