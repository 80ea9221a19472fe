"""pack: varlen samples in a padded [B, L] batch -> the packed token layout; gradient dx (unpack)."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.canonical import RowIdentity
from gradsweep.ops.base import CallContext, CallOutput, OpSpec, OutputSpec, TokenInput, kernel_candidates
from gradsweep.workload import PAD


class PackShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 32


def _reference(inputs, params, shape, rows):
    return {"packed": inputs["x"] * 1.0}


def _packed_rows(ctx: CallContext) -> RowIdentity:
    """Identity of the packed rows: the call's segments one after another (fillers keep their negative ids)."""
    segs = ctx.call.segments
    sample = torch.cat([torch.full((s.length,), s.sample, dtype=torch.int64) for s in segs])
    position = torch.cat([torch.arange(s.start, s.start + s.length, dtype=torch.int64) for s in segs])
    return RowIdentity(sample, position)


def _batch(ctx: CallContext) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x as [B, L, H], each sample's length and the column where it starts (right or left padding)."""
    b, width = ctx.call.padded
    x = ctx.inputs["x"]
    lengths = torch.tensor([s.length for s in ctx.call.segments], dtype=torch.int64)
    starts = torch.tensor([s.row_offset - i * width for i, s in enumerate(ctx.call.segments)], dtype=torch.int64)
    return x.reshape(b, width, *x.shape[1:]), lengths, starts


def _stock(ctx: CallContext) -> CallOutput:
    """What a trainer writes: x[attention_mask] (the mask marks the real tokens, left or right padded)."""
    x, _, _ = _batch(ctx)
    keep = (ctx.rows.sample != PAD).reshape(x.shape[0], x.shape[1]).to(x.device)  # fillers are real tokens
    return CallOutput({"packed": x[keep]}, rows=_packed_rows(ctx))


def _kernel(mod, ctx: CallContext) -> CallOutput:
    x, lengths, starts = _batch(ctx)
    return CallOutput({"packed": mod.pack(x, lengths, starts)}, rows=_packed_rows(ctx))


OP = OpSpec(
    name="pack",
    description="padded batch -> packed varlen tokens; gradient dx (unpack)",
    shape_model=PackShape,
    inputs=(TokenInput("x", lambda s: (s["hidden"],), grad="dx"),),
    params=(),
    outputs=(OutputSpec("packed", lambda s: (s["hidden"],)),),
    reference=_reference,
    stock=_stock,
    candidates={**kernel_candidates("pack", "pack", _kernel)},
    # Every call of pack is a padded batch, so bn_full already IS a right-padded batch: bn_padded_right
    # would hand the kernel the reference's own calls (a tautological cell). Left padding differs.
    layouts=("bn_full", "bn_chunked", "b1_singleton", "bn_padded_left", "bn_permuted", "bn_mask_density",
             "bn_neighbors", "prefix_cache", "bn_strided"),
    padded_input=True,
)
