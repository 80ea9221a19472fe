"""swiglu: silu(gate) * up; gradients dgate and dup."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, TokenInput, kernel_candidates


class SwigluShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    features: PositiveInt = 96


def _reference(inputs, params, shape, rows):
    g = inputs["gate"]
    return {"y": g * torch.sigmoid(g) * inputs["up"]}


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"y": F.silu(ctx.inputs["gate"]) * ctx.inputs["up"]})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"y": mod.swiglu(ctx.inputs["gate"], ctx.inputs["up"])})


def _feature(s):
    return (s["features"],)


OP = OpSpec(
    name="swiglu",
    description="SwiGLU gate: silu(gate) * up; gradients dgate and dup",
    shape_model=SwigluShape,
    inputs=(TokenInput("gate", _feature, grad="dgate", scale=2.0), TokenInput("up", _feature, grad="dup")),
    params=(),
    outputs=(OutputSpec("y", _feature),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("swiglu", "swiglu", _kernel)},
)
