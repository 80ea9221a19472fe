"""rope: rotary position embedding (rotate-half pairs (i, i + d/2)) at each token's absolute position."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, TokenInput, kernel_candidates, positions_on


class RopeShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    heads: PositiveInt = 3
    head_dim: PositiveInt = 32
    theta: float = Field(10000.0, gt=1.0)

    @model_validator(mode="after")
    def _even(self) -> RopeShape:
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for rotate-half RoPE (got {self.head_dim})")
        return self


def _feature(s):
    return (s["heads"], s["head_dim"])


def _angles(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> torch.Tensor:
    half = head_dim // 2
    inv = theta ** (-torch.arange(half, dtype=dtype, device=positions.device) * 2 / head_dim)
    return positions.to(dtype)[:, None] * inv[None, :]


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _reference(inputs, params, shape, rows):
    ang = _angles(rows.position.to(inputs["x"].device), shape["head_dim"], shape["theta"], torch.float64)
    return {"y": rotate(inputs["x"], ang.cos(), ang.sin())}


def _stock(ctx: CallContext) -> CallOutput:
    """The common HF pattern: fp32 angles, cos/sin tables cast to the activation dtype."""
    x = ctx.inputs["x"]
    ang = _angles(positions_on(ctx, x.device), ctx.shape["head_dim"], ctx.shape["theta"], torch.float32)
    return CallOutput({"y": rotate(x, ang.cos().to(x.dtype), ang.sin().to(x.dtype))})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    x = ctx.inputs["x"]
    return CallOutput({"y": mod.rope(x, positions_on(ctx, x.device), ctx.shape["theta"])})


OP = OpSpec(
    name="rope",
    description="rotary embedding at absolute positions; gradient dx",
    shape_model=RopeShape,
    inputs=(TokenInput("x", _feature, grad="dx"),),
    params=(),
    outputs=(OutputSpec("y", _feature),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("rope", "rope", _kernel)},
)
