"""SiLU: y = x * sigmoid(x), FP32 math inside; elementwise, hence batch-invariant by construction."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.kernel_api import run_function
from gradsweep.triton_kernels._common import FastLaunch, cdiv, to_out

BLOCK = 2048
WARPS = 8


@triton.jit
def _silu_fwd_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    y = x / (1.0 + tl.exp(-x))
    tl.store(y_ptr + off, to_out(y, y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _silu_bwd_kernel(x_ptr, dy_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    x = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-x))
    dx = dy * (s * (1.0 + x * (1.0 - s)))
    tl.store(dx_ptr + off, to_out(dx, dx_ptr.dtype.element_ty), mask=m)


_FWD = FastLaunch(_silu_fwd_kernel)
_BWD = FastLaunch(_silu_bwd_kernel)


def silu_forward(x: torch.Tensor) -> torch.Tensor:
    """Launcher (no autograd)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    if x.numel():
        _FWD((cdiv(x.numel(), BLOCK),), [x, y, x.numel()], {"BLOCK": BLOCK}, num_warps=WARPS)
    return y


def silu_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """dx = dy * sigmoid(x) * (1 + x * (1 - sigmoid(x))) (no autograd)."""
    dy = dy.contiguous()
    dx = torch.empty_like(x)
    if x.numel():
        _BWD((cdiv(x.numel(), BLOCK),), [x, dy, dx, x.numel()], {"BLOCK": BLOCK}, num_warps=WARPS)
    return dx


class _SiluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        x = x.contiguous()
        ctx.save_for_backward(x)
        return silu_forward(x)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return silu_backward(x, dy)


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU of a tensor of any shape (bf16 in, bf16 out)."""
    return run_function(_SiluFn, x)
