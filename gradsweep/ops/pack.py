"""pack: varlen samples in a padded [B, L] batch -> the packed token layout; gradient dx (unpack)."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.canonical import RowIdentity
from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    OpSpec,
    OutputSpec,
    TokenInput,
    kernel_candidates,
    torch_candidate,
)


class PackShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 32


def _reference(inputs, params, shape, rows):
    return {"packed": inputs["x"] * 1.0}


def _packed_rows(ctx: CallContext) -> RowIdentity:
    segs = ctx.call.segments
    return RowIdentity.packed([s.length for s in segs], [s.sample for s in segs], [s.start for s in segs])


def _batch(ctx: CallContext) -> tuple[torch.Tensor, torch.Tensor]:
    b, width = ctx.call.padded
    x = ctx.inputs["x"]
    lengths = torch.tensor([s.length for s in ctx.call.segments], dtype=torch.int64, device=x.device)
    return x.reshape(b, width, *x.shape[1:]), lengths


def _stock(ctx: CallContext) -> CallOutput:
    x, lengths = _batch(ctx)
    keep = torch.arange(x.shape[1], device=x.device)[None, :] < lengths[:, None]
    return CallOutput({"packed": x[keep]}, rows=_packed_rows(ctx))


def _kernel(mod, ctx: CallContext) -> CallOutput:
    x, lengths = _batch(ctx)
    return CallOutput({"packed": mod.pack(x, lengths)}, rows=_packed_rows(ctx))


OP = OpSpec(
    name="pack",
    description="padded batch -> packed varlen tokens; gradient dx (unpack)",
    shape_model=PackShape,
    inputs=(TokenInput("x", lambda s: (s["hidden"],), grad="dx"),),
    params=(),
    outputs=(OutputSpec("packed", lambda s: (s["hidden"],)),),
    reference=_reference,
    candidates={**torch_candidate("pack", _stock),
                **kernel_candidates("pack", "pack", _kernel, families=("triton",))},
    layouts=("bn_full", "bn_chunked", "b1_singleton", "bn_padded_right", "bn_permuted", "bn_mask_density"),
    padded_input=True,
)
