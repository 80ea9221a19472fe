"""Rotary position embedding, rotate-half (GPT-NeoX) convention, batch-invariant by construction.

Pairs (i, i + d/2) of each head are rotated by angle = position * theta^(-2i/d). The angle is computed
in FP32 inside the kernel from the integer position (never read from a bf16 cos/sin table), so a
token's bits depend on its position only. Backward applies the inverse rotation to dy.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gradsweep.kernel_api import rope_function, run_function
from gradsweep.triton_kernels._common import FastLaunch, cdiv, pow2, to_out


def _config(heads: int, half: int) -> tuple[int, int, int, int]:
    """(TOKENS per program, heads padded to a power of two, BLOCK_HALF, num_warps): at least 2048 elements of each
    half-row a program, 16 of them a thread (two 16-byte loads per half: at 32 x 128, 1 token and 4 warps read 96%
    of the copy bandwidth on an H100, 8 warps 95%, 16 warps 90%; scripts/rope_ab.py). A function of the feature
    sizes only, never of R; the products are explicit fmas (``_rope_kernel``), so the tiling moves no bit."""
    bf, nhp = pow2(half), pow2(heads)
    tok = max(1, 2048 // (nhp * bf))
    return tok, nhp, bf, min(16, max(4, tok * nhp * bf // 512))


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, y_ptr, n_rows, HALF, neg_log2_theta_over_half,
                 NH: tl.constexpr, NHP: tl.constexpr, TOK: tl.constexpr, BF: tl.constexpr, INVERSE: tl.constexpr):
    """TOK tokens per program, every head at once: both half-rows of the [TOK, heads, half] block are loaded before
    cos / sin are computed (once per [TOK, half], libdevice sin / cos being the costly part) and broadcast over the
    heads. No loop: every load of the program is in flight together, as in the CUDA family's kernel (a pipelined
    loop over heads held this kernel at ~86% of the copy bandwidth; notes/triton_rowwise.md).

    The two products of each output are contracted explicitly (``tl.fma``): left to the compiler, ``x2 * c + x1 * s``
    became fma(x1, s, x2 * c) in the loop kernel and fma(x2, c, x1 * s) in this one, 1 bf16 ulp apart on 170 of
    16.7 M elements on an H100. Written out, the arithmetic is the loop kernel's whatever the block shape."""
    r = tl.program_id(0).to(tl.int64) * TOK + tl.arange(0, TOK)
    h = tl.arange(0, NHP)
    i = tl.arange(0, BF)
    rmask = r < n_rows
    m = rmask[:, None, None] & (h < NH)[None, :, None] & (i < HALF)[None, None, :]
    off = r[:, None, None] * (NH * 2 * HALF) + h[None, :, None] * (2 * HALF) + i[None, None, :]
    x1 = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + off + HALF, mask=m, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + r, mask=rmask, other=0).to(tl.float32)
    # theta^(-2i/d) = 2^(i * (-log2(theta) / half)), d = 2 * half; FP32 throughout.
    ang = pos[:, None] * tl.exp2(i.to(tl.float32) * neg_log2_theta_over_half)[None, :]
    c = tl.cos(ang)
    s = tl.sin(ang)
    if INVERSE:
        s = -s
    c = c[:, None, :]
    s = s[:, None, :]
    tl.store(y_ptr + off, to_out(tl.fma(x1, c, -(x2 * s)), y_ptr.dtype.element_ty), mask=m)
    tl.store(y_ptr + off + HALF, to_out(tl.fma(x1, s, x2 * c), y_ptr.dtype.element_ty), mask=m)


_ROPE = FastLaunch(_rope_kernel)


def rope_apply(x: torch.Tensor, positions: torch.Tensor, theta: float, inverse: bool = False) -> torch.Tensor:
    """Launcher (no autograd): rotate x [R, heads, head_dim] (inverse=True: the transpose rotation)."""
    n_rows, heads, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"rope: head_dim must be even, got {head_dim}")
    if positions.shape != (n_rows,):
        raise ValueError(f"rope: positions must be [R]={n_rows}, got {tuple(positions.shape)}")
    if positions.device != x.device:
        raise ValueError("rope: positions must be on x's device")
    x = x.contiguous()
    y = torch.empty_like(x)
    if x.numel() == 0:
        return y
    half = head_dim // 2
    tok, nhp, bf, warps = _config(heads, half)
    coef = -math.log2(float(theta)) / half
    _ROPE((cdiv(n_rows, tok),), [x, positions.contiguous(), y, n_rows, half, coef],
          {"NH": heads, "NHP": nhp, "TOK": tok, "BF": bf, "INVERSE": inverse}, num_warps=warps)
    return y


_RopeFn = rope_function(rope_apply)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of x [R, heads, head_dim] at integer positions [R] (same device as x)."""
    if x.dim() != 3:
        raise ValueError(f"rope: expected x [R, heads, head_dim], got {tuple(x.shape)}")
    return run_function(_RopeFn, x, positions, theta)
