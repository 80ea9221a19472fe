"""rl_grpo: GRPO's per-token loss with per-token aggregation (the masked token mean over the whole step).

loss_t = -min(r A_s, clip(r, 1 - clip_low, 1 + clip_high) A_s) + beta k3, r = exp(logp - old_logp),
A_s = (reward_s - group mean) / (group std + adv_eps) over the group ``sample // group_size``; rewards are
hashed from (reward_seed, sample id). ``rl_grpo_seq`` is the same term under per-sequence aggregation.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from gradsweep.ops import rl_common as rl
from gradsweep.ops.base import CallContext, CallOutput, OpSpec, kernel_candidates


class GrpoShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    group_size: PositiveInt = 3
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    clip_high: float = Field(0.2, ge=0.0)
    beta: float = Field(0.04, ge=0.0)
    adv_eps: float = Field(1e-4, gt=0.0)
    reward_seed: int = 0


def _reference(inputs, params, shape, rows):
    n = rl.num_samples_of(rows.sample)
    return {"loss": rl.grpo_terms(inputs["logp"], inputs["old_logp"], inputs["ref_logp"], rows.sample, shape, n)}


def _stock(ctx: CallContext) -> CallOutput:
    i = ctx.inputs
    return CallOutput({"loss": rl.grpo_terms(i["logp"].float(), i["old_logp"].float(), i["ref_logp"].float(),
                                             ctx.rows.sample, ctx.shape, len(ctx.lengths))})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    i, s = ctx.inputs, ctx.shape
    rewards = rl.sample_rewards(s["reward_seed"], len(ctx.lengths), i["logp"].device)
    return CallOutput({"loss": mod.grpo_loss(i["logp"], i["old_logp"], i["ref_logp"], ctx.rows.sample, rewards,
                                             s["group_size"], s["clip_low"], s["clip_high"], s["beta"],
                                             s["adv_eps"])})


def grpo_op(name: str, reduction: str, aggregation: str) -> OpSpec:
    return OpSpec(
        name=name,
        description=f"GRPO per-token loss (group-normalised advantages, clipped ratio, beta k3), {aggregation}; "
                    "gradient dlogp",
        shape_model=GrpoShape,
        inputs=(rl.POLICY_LOGP, rl.logp_input("old_logp"), rl.logp_input("ref_logp")),
        params=(),
        outputs=(rl.loss_output("loss", reduction),),
        reference=_reference,
        stock=_stock,
        candidates={**kernel_candidates(name, "rl_token", _kernel)},
    )


OP = grpo_op("rl_grpo", "token_mean", "per-token aggregation (masked token mean over the step)")
