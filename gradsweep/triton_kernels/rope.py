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
from gradsweep.triton_kernels._common import FastLaunch, cdiv, pow2, to_out, warps_for

STAGES = 3  # software-pipelining depth of the loop over heads (speed only, not bits)


def _config(half: int) -> tuple[int, int, int]:
    """(TOKENS per program, BLOCK_HALF, num_warps). Elementwise per token: any tiling gives the same bits."""
    bf = pow2(half)
    tok = max(1, 1024 // bf)
    return tok, bf, warps_for(tok * bf)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, y_ptr, n_rows, HALF, neg_log2_theta_over_half,
                 NH: tl.constexpr, TOK: tl.constexpr, BF: tl.constexpr, INVERSE: tl.constexpr,
                 STAGES: tl.constexpr):
    """TOK tokens per program: cos/sin of their angles computed once ([TOK, HALF], libdevice sin/cos
    are the costly part), then applied to every head in a pipelined loop."""
    r = tl.program_id(0).to(tl.int64) * TOK + tl.arange(0, TOK)
    i = tl.arange(0, BF)
    rmask = r < n_rows
    m = rmask[:, None] & (i < HALF)[None, :]
    pos = tl.load(pos_ptr + r, mask=rmask, other=0).to(tl.float32)
    # theta^(-2i/d) = 2^(i * (-log2(theta) / half)), d = 2 * half; FP32 throughout.
    ang = pos[:, None] * tl.exp2(i.to(tl.float32) * neg_log2_theta_over_half)[None, :]
    c = tl.cos(ang)
    s = tl.sin(ang)
    if INVERSE:
        s = -s
    base = r[:, None] * (NH * 2 * HALF) + i[None, :]
    for h in tl.range(0, NH, num_stages=STAGES):
        off = base + h * (2 * HALF)
        x1 = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + off + HALF, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + off, to_out((x1 * c - x2 * s), y_ptr.dtype.element_ty), mask=m)
        tl.store(y_ptr + off + HALF, to_out((x2 * c + x1 * s), y_ptr.dtype.element_ty), mask=m)


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
    tok, bf, warps = _config(half)
    coef = -math.log2(float(theta)) / half
    _ROPE((cdiv(n_rows, tok),), [x, positions.contiguous(), y, n_rows, half, coef],
          {"NH": heads, "TOK": tok, "BF": bf, "INVERSE": inverse, "STAGES": STAGES}, num_warps=warps)
    return y


_RopeFn = rope_function(rope_apply)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of x [R, heads, head_dim] at integer positions [R] (same device as x)."""
    if x.dim() != 3:
        raise ValueError(f"rope: expected x [R, heads, head_dim], got {tuple(x.shape)}")
    return run_function(_RopeFn, x, positions, theta)
