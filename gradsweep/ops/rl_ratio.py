"""rl_ratio: the importance ratio exp(logp - old_logp) per token (the trainer's policy over the rollout's);
gradient dlogp. Its upstream is the harness's masked token mean."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gradsweep.ops import rl_common as rl
from gradsweep.ops.base import CallContext, CallOutput, OpSpec, kernel_candidates


class RatioShape(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _reference(inputs, params, shape, rows):
    return {"ratio": rl.ratio(inputs["logp"], inputs["old_logp"])}


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"ratio": rl.ratio(ctx.inputs["logp"].float(), ctx.inputs["old_logp"].float())})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"ratio": mod.importance_ratio(ctx.inputs["logp"], ctx.inputs["old_logp"])})


OP = OpSpec(
    name="rl_ratio",
    description="importance ratio exp(logp - old_logp) per token; gradient dlogp",
    shape_model=RatioShape,
    inputs=(rl.POLICY_LOGP, rl.logp_input("old_logp")),
    params=(),
    outputs=(rl.loss_output("ratio"),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("rl_ratio", "rl_token", _kernel)},
)
