"""rms_norm: y = x * rsqrt(mean(x^2) + eps) * weight over the hidden dimension."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, ParamSpec, TokenInput, kernel_candidates


class RmsNormShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 96
    eps: float = Field(1e-6, gt=0)


def rms_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def norm_reference(inputs, params, shape, rows):
    """FP64 reference of y = RMSNorm(x) * weight over the last axis (rms_norm and qk_norm)."""
    return {"y": rms_reference(inputs["x"], params["weight"], shape["eps"])}


def stock_norm(ctx: CallContext) -> CallOutput:
    """Stock ``F.rms_norm`` over the last axis (rms_norm and qk_norm)."""
    x, w = ctx.inputs["x"], ctx.params["weight"]
    return CallOutput({"y": F.rms_norm(x, (x.shape[-1],), w, ctx.shape["eps"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"y": mod.rms_norm(ctx.inputs["x"], ctx.params["weight"], ctx.shape["eps"],
                                         ctx.rows, ctx.fold("weight"))})


OP = OpSpec(
    name="rms_norm",
    description="RMSNorm over hidden; gradients dx and dweight",
    shape_model=RmsNormShape,
    inputs=(TokenInput("x", lambda s: (s["hidden"],), grad="dx"),),
    params=(ParamSpec("weight", lambda s: (s["hidden"],), grad="dweight", scale=lambda s: 0.1, offset=1.0),),
    outputs=(OutputSpec("y", lambda s: (s["hidden"],)),),
    reference=norm_reference,
    stock=stock_norm,
    candidates={**kernel_candidates("rms_norm", "rms_norm", _kernel, fold_params=("weight",))},
)
