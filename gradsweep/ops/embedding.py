"""embedding: gather rows of a table by token id; gradient dweight (a scatter-add over tokens)."""

from __future__ import annotations

import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, ParamSpec, TokenInput, kernel_candidates


class EmbeddingShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    vocab: PositiveInt = 50
    hidden: PositiveInt = 96


def _reference(inputs, params, shape, rows):
    return {"y": params["weight"][inputs["ids"]]}


def _stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"y": F.embedding(ctx.inputs["ids"], ctx.params["weight"])})


def _kernel(mod, ctx: CallContext) -> CallOutput:
    return CallOutput({"y": mod.embedding(ctx.inputs["ids"], ctx.params["weight"], ctx.rows,
                                          ctx.fold("weight"))})


OP = OpSpec(
    name="embedding",
    description="token-id gather; gradient dweight folded per vocabulary row",
    shape_model=EmbeddingShape,
    inputs=(TokenInput("ids", lambda s: (), index_high=lambda s: s["vocab"]),),
    params=(ParamSpec("weight", lambda s: (s["vocab"], s["hidden"]), grad="dweight"),),
    outputs=(OutputSpec("y", lambda s: (s["hidden"],)),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("embedding", "embedding", _kernel, fold_params=("weight",))},
)
