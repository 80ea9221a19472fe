"""Planted operators that the harness must catch (and one it must pass); registered as a plugin.

Each is a real computation with a known defect, so tests can predict exactly which cells go red.
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, PositiveInt

from gradsweep.ops.base import CallContext, CallOutput, Candidate, OpSpec, OutputSpec, ParamSpec, TokenInput
from gradsweep.ops.registry import register

SPLIT_THRESHOLD = 8  # planted_splitk: calls of at most this many rows take a different reduction order


class PlantedShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    features: PositiveInt = 256


def _feature(s):
    return (s["features"],)


def coefficients(n: int, device, dtype=torch.float32) -> torch.Tensor:
    """Fixed per-feature coefficients (not a parameter: the planted ops have only dx)."""
    return torch.linspace(-1.5, 2.0, n, dtype=torch.float64, device=device).to(dtype)


def sequential_sum(prod: torch.Tensor) -> torch.Tensor:
    """Left-to-right fp32 sum along the last dim (torch's CPU cumsum accumulates in double)."""
    acc = torch.zeros(prod.shape[0], dtype=prod.dtype, device=prod.device)
    for j in range(prod.shape[1]):
        acc = acc + prod[:, j]
    return acc[:, None]


def _rowsum_reference(inputs, params, shape, rows):
    x = inputs["x"]
    return {"y": (x * coefficients(x.shape[1], x.device, torch.float64)).sum(-1, keepdim=True)}


class _SplitKRowSum(torch.autograd.Function):
    """y = sum_j x_j w_j in fp32; a 4-way split-K whose presence depends on the number of rows."""

    @staticmethod
    def forward(ctx, x):
        w = coefficients(x.shape[1], x.device)
        ctx.save_for_backward(x, w)
        prod = x.float() * w
        if x.shape[0] <= SPLIT_THRESHOLD:
            parts = prod.reshape(x.shape[0], 4, -1).sum(-1)
            y = ((parts[:, 0] + parts[:, 1]) + (parts[:, 2] + parts[:, 3]))[:, None]
        else:
            y = sequential_sum(prod)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g * w).to(x.dtype)


class _RandomOrderRowSum(torch.autograd.Function):
    """y = sum_j x_j w_j, its fp32 terms added in a fresh random order each call (as atomics would)."""

    @staticmethod
    def forward(ctx, x):
        w = coefficients(x.shape[1], x.device)
        ctx.save_for_backward(x, w)
        prod = (x.float() * w)[:, torch.randperm(x.shape[1])]
        return sequential_sum(prod)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return (g * w).to(x.dtype)


def _honest(fn):
    def run(ctx: CallContext) -> CallOutput:
        return CallOutput({"y": fn.apply(ctx.inputs["x"])})
    return run


def _per_sample_cheat(ctx: CallContext) -> CallOutput:
    """The classic harness failure, planted in an adapter: every call silently run as N x B=1."""
    x = ctx.inputs["x"]
    parts = []
    for seg in ctx.call.segments:
        rows = torch.arange(seg.row_offset, seg.row_offset + seg.length)
        parts.append((rows, _SplitKRowSum.apply(x[rows])))
    out = torch.zeros(x.shape[0], 1, dtype=torch.float32, device=x.device)
    for rows, y in parts:
        out = out.index_put((rows,), y)
    return CallOutput({"y": out})


def _layout_ignoring(ctx: CallContext) -> CallOutput:
    """An adapter that ignores the layout: one output row per logical token, whatever rows it got."""
    total = sum(ctx.lengths)
    x = ctx.inputs["x"]
    return CallOutput({"y": _SplitKRowSum.apply(x[:1]).expand(total, 1)})


def _identity_only(ctx: CallContext) -> CallOutput:
    """Depends on logical identity only: row-wise, fixed order; the harness must call it green."""
    x = ctx.inputs["x"]
    return CallOutput({"y": sequential_sum(x.float() * coefficients(x.shape[1], x.device))})


OUTPUT_CACHE: dict[tuple, torch.Tensor] = {}  # the address_cached defect's outputs, by input address


def _address_cached(ctx: CallContext) -> CallOutput:
    """Row sums memoised on the input's address, shape and strides (contents never looked at): right in every
    fresh buffer, stale when the same memory is refilled (an engine reusing its batch buffers)."""
    x = ctx.inputs["x"]
    y = _identity_only(ctx).tensors["y"]
    key = (x.data_ptr(), tuple(x.shape), tuple(x.stride()))
    if key in OUTPUT_CACHE:
        y = y - y.detach() + OUTPUT_CACHE[key]  # the memoised values, the gradient path kept
    OUTPUT_CACHE[key] = y.detach().clone()
    return CallOutput({"y": y})


def _no_backward(ctx: CallContext) -> CallOutput:
    with torch.no_grad():
        return _identity_only(ctx)


CANDIDATES = {
    "torch.splitk": Candidate("torch.splitk", "torch", _honest(_SplitKRowSum)),
    "torch.random_order": Candidate("torch.random_order", "torch", _honest(_RandomOrderRowSum)),
    "torch.per_sample_cheat": Candidate("torch.per_sample_cheat", "torch", _per_sample_cheat),
    "torch.layout_ignoring": Candidate("torch.layout_ignoring", "torch", _layout_ignoring),
    "torch.identity_only": Candidate("torch.identity_only", "torch", _identity_only),
    "torch.no_backward": Candidate("torch.no_backward", "torch", _no_backward),
    "torch.address_cached": Candidate("torch.address_cached", "torch", _address_cached),
}

OP = register(OpSpec(
    name="planted_rowsum",
    description="row-wise dot product with a weight; planted variants of its implementation",
    shape_model=PlantedShape,
    inputs=(TokenInput("x", _feature, grad="dx"),),
    params=(),
    outputs=(OutputSpec("y", lambda s: (1,), dtype=torch.float32),),
    reference=_rowsum_reference,
    stock=_identity_only,
    candidates=CANDIDATES,
))


# --------------------------------------------------------------------------------------------- planted_scale
# y = x * w with a per-feature parameter w: the smallest op with a token reduction (dw). Its honest
# candidate folds dw by the canonical protocol (per-tile FP64 sums, FP32 accumulator loaded first); each
# planted variant hides one defect that only hostile boundaries, a nonzero starting main grad or the
# backward order of a real model expose.

SCALE_TILE = 8
LAST_FORWARD: dict[str, torch.Tensor] = {}  # the stateful defect's global scratch
WEIGHT_CACHE: dict[tuple, torch.Tensor] = {}  # the weight_cache defect's converted weights, by address


def _converted_weight(w: torch.Tensor) -> torch.Tensor:
    """The weight_cache defect: an FP32 copy of the weight kept by address (as a cached transposed or quantised
    weight would be), never refreshed when the same memory holds new values (an optimizer's in-place update)."""
    key = (w.data_ptr(), tuple(w.shape))
    if key not in WEIGHT_CACHE:
        WEIGHT_CACHE[key] = w.detach().float().clone()
    return WEIGHT_CACHE[key]


class ScaleShape(BaseModel):
    model_config = ConfigDict(extra="forbid")
    features: PositiveInt = 24


def _scale_reference(inputs, params, shape, rows):
    return {"y": inputs["x"] * params["w"]}


def _scale_stock(ctx: CallContext) -> CallOutput:
    return CallOutput({"y": ctx.inputs["x"].float() * ctx.params["w"].float()})


def fold_tiles(fold, rows, x: torch.Tensor, dy: torch.Tensor, *, keep_start: bool = True) -> None:
    """The canonical fold of dw = sum_t x_t * dy_t: tiles in order, each summed in FP64, added in FP32."""
    if not keep_start and fold.cursor == 0:
        fold.main_grad.zero_()  # defect: the accumulator handed in is ignored
    step = fold.take(rows, (x.detach().float(), dy.detach().float()))
    src_x, src_dy = step.tensors
    for t in range(step.num_tiles):
        idx = step.plan[t].long()
        valid = (idx >= 0)[:, None]
        xs = torch.where(valid, src_x[idx.clamp(min=0)], torch.zeros_like(src_x[:1]))  # masked, never 0 * NaN
        gs = torch.where(valid, src_dy[idx.clamp(min=0)], torch.zeros_like(src_dy[:1]))
        fold.main_grad += (xs.double() * gs.double()).sum(0).float()


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, rows, fold, variant):
        ctx.save_for_backward(x, w)
        ctx.rows, ctx.fold, ctx.variant = rows, fold, variant
        LAST_FORWARD["x"] = x.detach()
        return x.float() * (_converted_weight(w) if variant == "weight_cache" else w.float())

    @staticmethod
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        if ctx.variant == "stateful":  # defect: the backward reads the LAST forward's activations
            x = LAST_FORWARD["x"] if LAST_FORWARD["x"].shape == x.shape else x
        if ctx.variant != "never_folds":
            fold_tiles(ctx.fold, ctx.rows, x, dy, keep_start=ctx.variant != "ignore_start")
        if ctx.variant == "folds_pads":  # defect: pad rows are added too (harmless only if pads were zeros)
            pads = (ctx.rows.sample == -1).to(x.device)
            if bool(pads.any()):
                ctx.fold.main_grad += (x[pads].float() * dy[pads]).sum(0)
        wf = _converted_weight(w) if ctx.variant == "weight_cache" else w.float()
        return (dy * wf).to(x.dtype), None, None, None, None


def _scale_candidate(variant: str) -> Candidate:
    def run(ctx: CallContext) -> CallOutput:
        y = _Scale.apply(ctx.inputs["x"], ctx.params["w"], ctx.rows, ctx.fold("w"), variant)
        return CallOutput({"y": y * (1.0 + 2.0 ** -8) if variant == "scaled_output" else y})
    return Candidate(f"torch.scale_{variant}", "torch", run, param_grads="fold", fold_tiles=lambda: {"w": SCALE_TILE})


SCALE_VARIANTS = ("scaled_output", "honest", "folds_pads", "ignore_start", "never_folds", "stateful", "weight_cache")
SCALE = register(OpSpec(
    name="planted_scale",
    description="y = x * w, dw folded canonically; planted variants of its implementation",
    shape_model=ScaleShape,
    inputs=(TokenInput("x", _feature, grad="dx"),),
    params=(ParamSpec("w", _feature, grad="dw", scale=lambda s: 0.5, offset=1.0),),
    outputs=(OutputSpec("y", _feature, dtype=torch.float32),),
    reference=_scale_reference,
    stock=_scale_stock,
    # the defective "scaled_output" candidate is listed FIRST: the accuracy baseline must still be the stock path
    candidates={f"torch.scale_{v}": _scale_candidate(v) for v in SCALE_VARIANTS},
))
