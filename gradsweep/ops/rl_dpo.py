"""rl_dpo: DPO's pair loss -log sigmoid(beta (rho_chosen - rho_rejected)) on every token of the pair, with
rho_s = sum over sample s of in_response * (logp - ref_logp); pairs are samples (2k, 2k + 1). Gradient dlogp.

The upstream is the harness's per-sequence mean, so the step's loss is the mean over sequences of their pair's
loss (each pair counted once per sequence holding an active token).

Not every layout: a token's loss needs the sums over both WHOLE sequences of its pair, which do not exist
until their last tokens have been seen; a trainer computes DPO with both sequences in one forward. So the op
runs only where every pair arrives whole in one call (packed, padded, permuted, between loss-masked
fillers); chunked prefill, decode, one sample per call and regrouped neighbours would split a pair.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from gradsweep.ops import rl_common as rl
from gradsweep.ops.base import CallContext, CallOutput, OpSpec, TokenInput, kernel_candidates

WHOLE_PAIR_LAYOUTS = ("bn_full", "bn_padded_right", "bn_padded_left", "bn_permuted", "bn_mask_density", "bn_strided")


class DpoShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    beta: float = Field(0.1, gt=0.0)


def dpo_terms(logp, ref_logp, in_response, sample, beta: float, num_samples: int):
    """Per-row pair loss in torch (stock: FP32 with index_add_, what a packed trainer writes; reference: FP64)."""
    sample = sample.to(logp.device)
    real = sample >= 0
    idx = sample.clamp(min=0)
    contrib = torch.where(real, (logp - ref_logp) * in_response.to(logp.dtype), torch.zeros_like(logp))
    seq = torch.zeros(num_samples, dtype=logp.dtype, device=logp.device).index_add(0, idx, contrib)
    rejected = torch.cat([seq[1::2], seq.new_zeros(num_samples % 2)])
    pair_loss = -torch.nn.functional.logsigmoid(beta * (seq[0::2] - rejected))
    return torch.where(real, pair_loss[idx // 2], torch.zeros_like(logp))


def _reference(inputs, params, shape, rows):
    n = rl.num_samples_of(rows.sample)
    return {"loss": dpo_terms(inputs["logp"], inputs["ref_logp"], inputs["in_response"], rows.sample,
                              shape["beta"], n)}


def _stock(ctx: CallContext) -> CallOutput:
    i = ctx.inputs
    return CallOutput({"loss": dpo_terms(i["logp"].float(), i["ref_logp"].float(), i["in_response"], ctx.rows.sample,
                                         ctx.shape["beta"], len(ctx.lengths))})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    i = ctx.inputs
    return CallOutput({"loss": mod.dpo_loss(i["logp"], i["ref_logp"], i["in_response"], ctx.rows, ctx.lengths,
                                            ctx.shape["beta"])})


OP = OpSpec(
    name="rl_dpo",
    description="DPO pair loss on every token of the pair (sequence log-ratio sums in position order); "
                "gradient dlogp",
    shape_model=DpoShape,
    inputs=(rl.POLICY_LOGP, rl.logp_input("ref_logp"), TokenInput("in_response", lambda s: (),
                                                                  index_high=lambda s: 2)),
    params=(),
    outputs=(rl.loss_output("loss", "sequence_mean"),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("rl_dpo", "rl_dpo", _kernel)},
    layouts=WHOLE_PAIR_LAYOUTS,
)
