"""linear_logp: fused lm_head + selected-token logp that never materialises [T, V] logits."""

from __future__ import annotations

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, kernel_candidates
from gradsweep.ops.batch_invariant_logp import (
    INPUTS,
    OUTPUTS,
    PARAMS,
    LinearLogpShape,
    linear_logp_reference,
    stock_linear_logp,
)


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"logp": mod.linear_logp(ctx.inputs["hidden"], ctx.params["W"], ctx.inputs["targets"],
                                               ctx.rows, ctx.fold("W"))})


OP = OpSpec(
    name="linear_logp",
    description="fused lm_head + logp (online log-sum-exp over vocab blocks); gradients dhidden, dW",
    shape_model=LinearLogpShape,
    inputs=INPUTS,
    params=PARAMS,
    outputs=OUTPUTS,
    reference=linear_logp_reference,
    stock=stock_linear_logp,
    candidates={**kernel_candidates("linear_logp", "linear_logp", _kernel, families=("triton", "cuda"),
                                    fold_params=("W",))},
)
