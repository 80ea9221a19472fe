"""RoPE (gradsweep._C), rotate-half (GPT-NeoX) pairs (i, i + d/2), bf16 in/out, FP32 math.

angle(i) = position * theta^(-2i/d) is computed in fp32 inside the kernel from the integer position, so a
token's rotation depends on its position only, never on its row or on the batch. The backward rotates dy
by -angle (the exact transpose of the rotation).
"""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt
from gradsweep.kernel_api import rope_function, run_function


def rope_apply(x: torch.Tensor, positions: torch.Tensor, theta: float, inverse: bool) -> torch.Tensor:
    """Rotate x [R, heads, head_dim] by +angle (inverse=False) or -angle (inverse=True)."""
    n_rows, heads, head_dim = x.shape
    y = torch.empty_like(x)
    if x.numel():
        dev, stream = rt.launch(x)
        rt.ext().rope(rt.ptr(x), rt.ptr(positions), rt.ptr(y), n_rows, heads, head_dim, float(theta), inverse,
                      dev, stream)
    return y


_RopeFn = rope_function(rope_apply, grad_dtype=torch.bfloat16)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """RoPE of x [R, heads, head_dim] (bf16, CUDA, head_dim even) at integer positions [R].

    Differentiable in x (positions and theta get no gradient).
    """
    rt.check_tensor("rope x", x)
    if x.dim() != 3 or x.shape[2] % 2 != 0:
        raise ValueError(f"rope: expected x [R, heads, head_dim] with head_dim even, got {tuple(x.shape)}")
    if positions.dim() != 1 or positions.shape[0] != x.shape[0]:
        raise ValueError(f"rope: positions must be [R]={x.shape[0]}, got {tuple(positions.shape)}")
    if positions.dtype.is_floating_point or positions.dtype == torch.bool:
        raise ValueError(f"rope: positions must be integers, got {positions.dtype}")
    pos = positions.to(device=x.device, dtype=torch.int64).contiguous()
    return run_function(_RopeFn, x.contiguous(), pos, float(theta))
