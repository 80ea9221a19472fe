"""det_gemm: a linear layer y = x @ W.T; gradients dX and dW."""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    OpSpec,
    OutputSpec,
    ParamSpec,
    TokenInput,
    kernel_candidates,
    torch_candidate,
)


class GemmShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    in_features: PositiveInt = 48
    out_features: PositiveInt = 80


def _reference(inputs, params, shape, rows):
    return {"y": inputs["x"] @ params["W"].T}


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"y": F.linear(ctx.inputs["x"], ctx.params["W"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"y": mod.det_linear(ctx.inputs["x"], ctx.params["W"], ctx.rows, ctx.fold("W"))})


OP = OpSpec(
    name="det_gemm",
    description="linear layer x @ W.T; gradients dX and dW",
    shape_model=GemmShape,
    inputs=(TokenInput("x", lambda s: (s["in_features"],), grad="dX"),),
    params=(ParamSpec("W", lambda s: (s["out_features"], s["in_features"]), grad="dW",
                      scale=lambda s: s["in_features"] ** -0.5),),
    outputs=(OutputSpec("y", lambda s: (s["out_features"],)),),
    reference=_reference,
    candidates={**torch_candidate("det_gemm", _stock),
                **kernel_candidates("det_gemm", "gemm", _kernel, families=("triton",), fold_params=("W",))},
)
