"""qk_norm: RMSNorm of each attention head over head_dim (one weight shared by all heads)."""

from __future__ import annotations

from pydantic import Field

from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    HeadsShape,
    OpSpec,
    OutputSpec,
    ParamSpec,
    TokenInput,
    head_feature,
    kernel_candidates,
)
from gradsweep.ops.rms_norm import norm_reference, stock_norm


class QkNormShape(HeadsShape):
    """heads x head_dim (hidden, if given, must be their product) and the norm's eps."""

    eps: float = Field(1e-6, gt=0)


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"y": mod.qk_norm(ctx.inputs["x"], ctx.params["weight"], ctx.shape["eps"],
                                        ctx.rows, ctx.fold("weight"))})


OP = OpSpec(
    name="qk_norm",
    description="per-head RMSNorm over head_dim (QK-norm); gradients dx and dweight",
    shape_model=QkNormShape,
    inputs=(TokenInput("x", head_feature, grad="dx"),),
    params=(ParamSpec("weight", lambda s: (s["head_dim"],), grad="dweight", scale=lambda s: 0.1, offset=1.0),),
    outputs=(OutputSpec("y", head_feature),),
    reference=norm_reference,
    stock=stock_norm,
    candidates={**kernel_candidates("qk_norm", "qk_norm", _kernel, fold_params=("weight",))},
)
