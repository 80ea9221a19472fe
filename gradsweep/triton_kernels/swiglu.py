"""SwiGLU: y = silu(gate) * up, FP32 math inside; elementwise, hence batch-invariant by construction.

The backward reads gate, up, dy once and writes dgate, dup in one pass (5 tensors of traffic).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.kernel_api import run_function
from gradsweep.triton_kernels._common import FastLaunch, cdiv, to_out

BLOCK = 2048
WARPS = 8


@triton.jit
def _swiglu_fwd_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    g = tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + off, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(y_ptr + off, to_out(y, y_ptr.dtype.element_ty), mask=m)


@triton.jit
def _swiglu_bwd_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    g = tl.load(g_ptr + off, mask=m, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + off, mask=m, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-g))
    act = g * s
    dg = dy * u * (s * (1.0 + g * (1.0 - s)))
    du = dy * act
    tl.store(dg_ptr + off, to_out(dg, dg_ptr.dtype.element_ty), mask=m)
    tl.store(du_ptr + off, to_out(du, du_ptr.dtype.element_ty), mask=m)


_FWD = FastLaunch(_swiglu_fwd_kernel)
_BWD = FastLaunch(_swiglu_bwd_kernel)


def swiglu_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Launcher (no autograd)."""
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    gate, up = gate.contiguous(), up.contiguous()
    y = torch.empty_like(gate)
    if gate.numel():
        _FWD((cdiv(gate.numel(), BLOCK),), [gate, up, y, gate.numel()], {"BLOCK": BLOCK}, num_warps=WARPS)
    return y


def swiglu_backward(gate: torch.Tensor, up: torch.Tensor,
                    dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dgate, dup) in one pass (no autograd)."""
    dy = dy.contiguous()
    dg, du = torch.empty_like(gate), torch.empty_like(up)
    if gate.numel():
        _BWD((cdiv(gate.numel(), BLOCK),), [gate, up, dy, dg, du, gate.numel()], {"BLOCK": BLOCK},
             num_warps=WARPS)
    return dg, du


class _SwigluFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        gate, up = gate.contiguous(), up.contiguous()
        ctx.save_for_backward(gate, up)
        return swiglu_forward(gate, up)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        gate, up = ctx.saved_tensors
        return swiglu_backward(gate, up, dy)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate, up [R, I] (any equal shapes), bf16 in/out."""
    return run_function(_SwigluFn, gate, up)
