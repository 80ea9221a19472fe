"""lm_head: hidden -> vocabulary logits; gradients dhidden and dW (the det_gemm machinery, vocab wide)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.det_gemm import linear_op


class LmHeadShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 48
    vocab: PositiveInt = 300


OP = linear_op("lm_head", "hidden -> vocab logits; gradients dhidden and dW", LmHeadShape, "hidden", "hidden",
               "dhidden", "logits", "vocab", module="lm_head", function="lm_head")
