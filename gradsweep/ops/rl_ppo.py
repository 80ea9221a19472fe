"""rl_ppo: PPO's clipped surrogate per token, -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A) with
r = exp(logp - old_logp) and per-token advantages A; gradient dlogp under the harness's masked token mean."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gradsweep.ops import rl_common as rl
from gradsweep.ops.base import CallContext, CallOutput, OpSpec, TokenInput, kernel_candidates


class PpoShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.2, ge=0.0)


def _reference(inputs, params, shape, rows):
    return {"loss": rl.clipped_surrogate(inputs["logp"], inputs["old_logp"], inputs["advantages"],
                                         shape["clip_low"], shape["clip_high"])}


def _stock(ctx: CallContext) -> CallOutput:
    i = ctx.inputs
    return CallOutput({"loss": rl.clipped_surrogate(i["logp"].float(), i["old_logp"].float(), i["advantages"].float(),
                                                    ctx.shape["clip_low"], ctx.shape["clip_high"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    i = ctx.inputs
    return CallOutput({"loss": mod.ppo_loss(i["logp"], i["old_logp"], i["advantages"], ctx.shape["clip_low"],
                                            ctx.shape["clip_high"])})


OP = OpSpec(
    name="rl_ppo",
    description="PPO clipped surrogate per token; gradient dlogp",
    shape_model=PpoShape,
    inputs=(rl.POLICY_LOGP, rl.logp_input("old_logp"), TokenInput("advantages", lambda s: ())),
    params=(),
    outputs=(rl.loss_output("loss"),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("rl_ppo", "rl_token", _kernel)},
)
