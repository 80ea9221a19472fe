"""logp: the selected token's log-probability from logits; gradient dlogits."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, TokenInput, kernel_candidates


class LogpShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vocab: PositiveInt = 300


def selected_logp_reference(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def stock_selected_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """What trainers write today: fp32 log_softmax of bf16 logits, then gather."""
    return torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None])[:, 0]


def _reference(inputs, params, shape, rows):
    return {"logp": selected_logp_reference(inputs["logits"], inputs["targets"])}


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"logp": stock_selected_logp(ctx.inputs["logits"], ctx.inputs["targets"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"logp": mod.selected_logp(ctx.inputs["logits"], ctx.inputs["targets"])})


OP = OpSpec(
    name="logp",
    description="selected-token log-prob from logits; gradient dlogits",
    shape_model=LogpShape,
    inputs=(TokenInput("logits", lambda s: (s["vocab"],), grad="dlogits", scale=2.0),
            TokenInput("targets", lambda s: (), index_high=lambda s: s["vocab"])),
    params=(),
    outputs=(OutputSpec("logp", lambda s: (), dtype=torch.float32),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("logp", "logp", _kernel)},
)
