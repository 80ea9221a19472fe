"""linear_logp: fused lm_head + selected-token logp that never materialises [T, V] logits."""

from __future__ import annotations

from gradsweep.ops.base import CallContext, CallOutput, kernel_candidates
from gradsweep.ops.batch_invariant_logp import logp_of_hidden_op


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"logp": mod.linear_logp(ctx.inputs["hidden"], ctx.params["W"], ctx.inputs["targets"],
                                               ctx.rows, ctx.fold("W"))})


OP = logp_of_hidden_op(
    "linear_logp", "fused lm_head + logp (online log-sum-exp over vocab blocks); gradients dhidden, dW",
    candidates={**kernel_candidates("linear_logp", "linear_logp", _kernel, fold_params=("W",))},
)
