"""det_gemm: a linear layer y = x @ W.T; gradients dX and dW. ``linear_op`` also declares lm_head."""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, ParamSpec, TokenInput, kernel_candidates


class GemmShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    in_features: PositiveInt = 48
    out_features: PositiveInt = 80


def linear_op(name: str, description: str, shape_model: type[BaseModel], x: str, x_dim: str, grad: str,
              y: str, y_dim: str, module: str, function: str) -> OpSpec:
    """A linear op as data: input ``x`` [x_dim] -> output ``y`` [y_dim] through W [y_dim, x_dim]."""

    def reference(inputs, params, shape, rows):
        return {y: inputs[x] @ params["W"].T}

    def stock(ctx: CallContext) -> CallOutput:
        return CallOutput({y: F.linear(ctx.inputs[x], ctx.params["W"])})

    def kernel(mod, ctx: CallContext) -> CallOutput:
        return CallOutput({y: getattr(mod, function)(ctx.inputs[x], ctx.params["W"], ctx.rows, ctx.fold("W"))})

    return OpSpec(
        name=name,
        description=description,
        shape_model=shape_model,
        inputs=(TokenInput(x, lambda s: (s[x_dim],), grad=grad),),
        params=(ParamSpec("W", lambda s: (s[y_dim], s[x_dim]), grad="dW", scale=lambda s: s[x_dim] ** -0.5),),
        outputs=(OutputSpec(y, lambda s: (s[y_dim],)),),
        reference=reference,
        stock=stock,
        candidates={**kernel_candidates(name, module, kernel, fold_params=("W",))},
    )


OP = linear_op("det_gemm", "linear layer x @ W.T; gradients dX and dW", GemmShape, "x", "in_features", "dX",
               "y", "out_features", module="gemm", function="det_linear")
