"""rl_kl: the KL(policy || ref) estimators k1, k2, k3 per token (one output each, all in one cell); gradient
dlogp of their sum under the harness's masked token mean."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from gradsweep.ops import rl_common as rl
from gradsweep.ops.base import CallContext, CallOutput, OpSpec, kernel_candidates


class KlShape(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _terms(logp, ref_logp) -> dict:
    k1, k2, k3 = rl.kl_terms(logp, ref_logp)
    return {"k1": k1, "k2": k2, "k3": k3}


def _reference(inputs, params, shape, rows):
    return _terms(inputs["logp"], inputs["ref_logp"])


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput(_terms(ctx.inputs["logp"].float(), ctx.inputs["ref_logp"].float()))


def _kernel(mod, ctx: CallContext) -> CallOutput:
    k1, k2, k3 = mod.kl_estimators(ctx.inputs["logp"], ctx.inputs["ref_logp"])
    return CallOutput({"k1": k1, "k2": k2, "k3": k3})


OP = OpSpec(
    name="rl_kl",
    description="KL estimators k1 = -d, k2 = d^2/2, k3 = exp(d) - 1 - d (d = ref_logp - logp); gradient dlogp",
    shape_model=KlShape,
    inputs=(rl.POLICY_LOGP, rl.logp_input("ref_logp")),
    params=(),
    outputs=(rl.loss_output("k1"), rl.loss_output("k2"), rl.loss_output("k3")),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("rl_kl", "rl_token", _kernel)},
)
