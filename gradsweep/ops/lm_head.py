"""lm_head: hidden -> vocabulary logits; gradients dhidden and dW."""

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


class LmHeadShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 48
    vocab: PositiveInt = 300


def _reference(inputs, params, shape, rows):
    return {"logits": inputs["hidden"] @ params["W"].T}


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"logits": F.linear(ctx.inputs["hidden"], ctx.params["W"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"logits": mod.lm_head(ctx.inputs["hidden"], ctx.params["W"], ctx.rows, ctx.fold("W"))})


OP = OpSpec(
    name="lm_head",
    description="hidden -> vocab logits; gradients dhidden and dW",
    shape_model=LmHeadShape,
    inputs=(TokenInput("hidden", lambda s: (s["hidden"],), grad="dhidden"),),
    params=(ParamSpec("W", lambda s: (s["vocab"], s["hidden"]), grad="dW", scale=lambda s: s["hidden"] ** -0.5),),
    outputs=(OutputSpec("logits", lambda s: (s["vocab"],)),),
    reference=_reference,
    candidates={**torch_candidate("lm_head", _stock),
                **kernel_candidates("lm_head", "lm_head", _kernel, families=("triton",), fold_params=("W",))},
)
