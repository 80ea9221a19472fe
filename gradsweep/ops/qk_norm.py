"""qk_norm: RMSNorm of each attention head over head_dim (one weight shared by all heads)."""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    OpSpec,
    OutputSpec,
    ParamSpec,
    TokenInput,
    kernel_candidates,
    torch_candidate,
)
from gradsweep.ops.rms_norm import rms_reference


class QkNormShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    heads: PositiveInt = 3
    head_dim: PositiveInt = 32
    hidden: PositiveInt | None = None

    @model_validator(mode="after")
    def _hidden_matches(self) -> QkNormShape:
        if self.hidden is not None and self.hidden != self.heads * self.head_dim:
            raise ValueError(f"hidden {self.hidden} != heads {self.heads} x head_dim {self.head_dim}; "
                             "make head_dim = hidden / heads")
        return self
    eps: float = Field(1e-6, gt=0)


def _feature(s):
    return (s["heads"], s["head_dim"])


def _reference(inputs, params, shape, rows):
    return {"y": rms_reference(inputs["x"], params["weight"], shape["eps"])}


def _stock(ctx: CallContext) -> CallOutput:
    x, w = ctx.inputs["x"], ctx.params["weight"]
    return CallOutput({"y": F.rms_norm(x, (x.shape[-1],), w, ctx.shape["eps"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"y": mod.qk_norm(ctx.inputs["x"], ctx.params["weight"], ctx.shape["eps"],
                                        ctx.rows, ctx.fold("weight"))})


OP = OpSpec(
    name="qk_norm",
    description="per-head RMSNorm over head_dim (QK-norm); gradients dx and dweight",
    shape_model=QkNormShape,
    inputs=(TokenInput("x", _feature, grad="dx"),),
    params=(ParamSpec("weight", lambda s: (s["head_dim"],), grad="dweight", scale=lambda s: 0.1, offset=1.0),),
    outputs=(OutputSpec("y", _feature),),
    reference=_reference,
    candidates={**torch_candidate("qk_norm", _stock),
                **kernel_candidates("qk_norm", "qk_norm", _kernel, families=("triton",),
                                    fold_params=("weight",))},
)
