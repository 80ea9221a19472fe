"""SiLU (gradsweep._C): y = x * sigmoid(x), bf16 in/out, FP32 math; element-wise, so batch-invariant."""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt
from gradsweep.kernel_api import run_function


def silu_forward(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    if x.numel():
        dev, stream = rt.launch(x)
        rt.ext().silu_fwd(rt.ptr(x), rt.ptr(y), x.numel(), dev, stream)
    return y


def silu_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    dx = torch.empty_like(x)
    if x.numel():
        dev, stream = rt.launch(x)
        rt.ext().silu_bwd(rt.ptr(x), rt.ptr(dy), rt.ptr(dx), x.numel(), dev, stream)
    return dx


class _SiluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        ctx.save_for_backward(x)
        return silu_forward(x)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (x,) = ctx.saved_tensors
        return silu_backward(x, dy.to(torch.bfloat16).contiguous())


def silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU of a bf16 CUDA tensor of any shape; differentiable."""
    rt.check_tensor("silu x", x)
    return run_function(_SiluFn, x.contiguous())
