"""silu: x * sigmoid(x); gradient dx."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import CallOutput, OpSpec, OutputSpec, TokenInput, kernel_candidates


class SiluShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    features: PositiveInt = 96


def _reference(inputs, params, shape, rows):
    x = inputs["x"]
    return {"y": x * torch.sigmoid(x)}


OP = OpSpec(
    name="silu",
    description="SiLU activation; gradient dx",
    shape_model=SiluShape,
    inputs=(TokenInput("x", lambda s: (s["features"],), grad="dx", scale=2.0),),
    params=(),
    outputs=(OutputSpec("y", lambda s: (s["features"],)),),
    reference=_reference,
    stock=lambda ctx: CallOutput({"y": F.silu(ctx.inputs["x"])}),
    candidates={**kernel_candidates("silu", "silu",
                                    lambda mod, ctx: CallOutput({"y": mod.silu(ctx.inputs["x"])}))},
)
