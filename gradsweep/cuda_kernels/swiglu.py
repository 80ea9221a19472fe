"""SwiGLU (gradsweep._C): y = silu(gate) * up, grads dgate and dup; bf16 in/out, FP32 math, element-wise."""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt
from gradsweep.kernel_api import run_function


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(gate)
    if gate.numel():
        dev, stream = rt.launch(gate)
        rt.ext().swiglu_fwd(rt.ptr(gate), rt.ptr(up), rt.ptr(y), gate.numel(), dev, stream)
    return y


def swiglu_backward(gate: torch.Tensor, up: torch.Tensor,
                    dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dgate = torch.empty_like(gate)
    dup = torch.empty_like(up)
    if gate.numel():
        dev, stream = rt.launch(gate)
        rt.ext().swiglu_bwd(rt.ptr(gate), rt.ptr(up), rt.ptr(dy), rt.ptr(dgate), rt.ptr(dup), gate.numel(),
                            dev, stream)
    return dgate, dup


class _SwigluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        gate, up = ctx.saved_tensors
        return swiglu_backward(gate, up, dy.to(torch.bfloat16).contiguous())


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for bf16 CUDA tensors of one shape; differentiable in both."""
    rt.check_tensor("swiglu gate", gate)
    rt.check_tensor("swiglu up", up)
    if gate.shape != up.shape or gate.device != up.device:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} on {gate.device} and up {tuple(up.shape)} on "
                         f"{up.device} must match")
    return run_function(_SwigluFn, gate.contiguous(), up.contiguous())
