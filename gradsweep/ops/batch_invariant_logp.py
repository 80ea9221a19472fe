"""batch_invariant_logp: lm_head then selected-token logp, unfused (logits materialised).

The chain a trainer runs today, on the family's invariant GEMM and logp kernels; gradients
dhidden and dW.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    Candidate,
    OpSpec,
    OutputSpec,
    ParamSpec,
    TokenInput,
    kernel_module,
)
from gradsweep.ops.logp import selected_logp_reference, stock_selected_logp


class LinearLogpShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 48
    vocab: PositiveInt = 300


def linear_logp_reference(inputs, params, shape, rows):
    return {"logp": selected_logp_reference(inputs["hidden"] @ params["W"].T, inputs["targets"])}


def stock_linear_logp(ctx: CallContext) -> CallOutput:
    logits = F.linear(ctx.inputs["hidden"], ctx.params["W"])
    return CallOutput({"logp": stock_selected_logp(logits, ctx.inputs["targets"])})


INPUTS = (TokenInput("hidden", lambda s: (s["hidden"],), grad="dhidden"),
          TokenInput("targets", lambda s: (), index_high=lambda s: s["vocab"]))
PARAMS = (ParamSpec("W", lambda s: (s["vocab"], s["hidden"]), grad="dW", scale=lambda s: s["hidden"] ** -0.5),)
OUTPUTS = (OutputSpec("logp", lambda s: (), dtype=torch.float32),)


def _triton_chain(ctx: CallContext) -> CallOutput:
    gemm, logp = kernel_module("triton", "gemm"), kernel_module("triton", "logp")
    logits = gemm.det_linear(ctx.inputs["hidden"], ctx.params["W"], ctx.rows, ctx.fold("W"))
    return CallOutput({"logp": logp.selected_logp(logits, ctx.inputs["targets"])})


def _cuda_chain(ctx: CallContext) -> CallOutput:
    mod = kernel_module("cuda", "batch_invariant_logp")
    return CallOutput({"logp": mod.batch_invariant_logp(ctx.inputs["hidden"], ctx.params["W"], ctx.inputs["targets"],
                                                        ctx.rows, ctx.fold("W"))})


def logp_of_hidden_op(name: str, description: str, candidates: dict[str, Candidate]) -> OpSpec:
    """An op computing logp from hidden states and the lm_head weight (this op and linear_logp): one declaration
    of its inputs, parameter, output, FP64 reference and stock path."""
    return OpSpec(name=name, description=description, shape_model=LinearLogpShape, inputs=INPUTS, params=PARAMS,
                  outputs=OUTPUTS, reference=linear_logp_reference, stock=stock_linear_logp, candidates=candidates)


OP = logp_of_hidden_op(
    "batch_invariant_logp",
    "lm_head GEMM then selected-token logp (logits materialised); gradients dhidden, dW",
    candidates={"triton.batch_invariant_logp": Candidate(
                    "triton.batch_invariant_logp", "triton", _triton_chain, param_grads="fold",
                    fold_tiles=lambda: {"W": int(kernel_module("triton", "gemm").TILE)}),
                "cuda.batch_invariant_logp": Candidate(
                    "cuda.batch_invariant_logp", "cuda", _cuda_chain, param_grads="fold",
                    fold_tiles=lambda: {"W": int(kernel_module("cuda", "batch_invariant_logp").TILE)})},
)
