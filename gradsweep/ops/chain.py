"""chain: a whole Qwen3-shaped decoder as one cell (gradsweep.nn.qwen3), token ids in, per-token logp out.

Every weight is a parameter (per-layer weights stacked [layers, ...]), so the cell checks every parameter
gradient (embedding, norms, q/k/v/o, qk-norms, gate/up/down, lm_head) and the logp bitwise across layouts.
A step spanning several calls (chunked prefill through the KV cache, one call per sample, decode, regrouped
neighbours, a shared prefix) runs the layerwise backward of gradsweep.nn (attention's dK/dV are final only
after every call's attention backward of a layer): the backward scope is the layout. The stock path is the
same model code on stock PyTorch ops (SDPA with a tensor KV cache, autograd gradients).
"""

from __future__ import annotations

import torch

from gradsweep.nn.context import ChainContext
from gradsweep.nn.qwen3 import LAYERED, WEIGHTS, Qwen3Decoder, Qwen3Shape, WeightSpec, fold_tiles, reference_logp
from gradsweep.ops.base import CallContext, CallOutput, Candidate, OpSpec, OutputSpec, ParamSpec, TokenInput

_SESSION = "chain"


def _shape(s: dict) -> Qwen3Shape:
    return Qwen3Shape(**s)


def _param(w: WeightSpec) -> ParamSpec:
    return ParamSpec(w.name, lambda s, _w=w: _w.full_shape(_shape(s)), grad=f"d{w.name}",
                     scale=lambda s, _w=w: _w.scale(_shape(s)), offset=w.offset)


def _reference(inputs, params, shape, rows):
    return {"logp": reference_logp(params, inputs["ids"], inputs["targets"], rows, _shape(shape))}


def _run(family: str, ctx: CallContext) -> CallOutput:
    """One call of the step; the model and its ChainContext live in the layout's state across calls."""
    session = ctx.state.get(_SESSION)
    if session is None:
        shape = _shape(ctx.shape)
        device = ctx.params["embed_tokens"].device
        chain = ChainContext(ctx.lengths, device, ctx.folds if family != "torch" else None, LAYERED, shape.layers,
                             mode="auto")
        session = ctx.state[_SESSION] = (Qwen3Decoder(shape, family, ctx.params), chain)
    model, chain = session
    chain.begin_call(ctx.rows)
    return CallOutput({"logp": model(ctx.inputs["ids"], ctx.inputs["targets"], chain)})


def _stock(ctx: CallContext) -> CallOutput:
    return _run("torch", ctx)


def _candidate(family: str) -> Candidate:
    def run(ctx: CallContext) -> CallOutput:
        return _run(family, ctx)

    return Candidate(f"{family}.chain", family, run, param_grads="fold", fold_tiles=lambda: fold_tiles(family))


OP = OpSpec(
    name="chain",
    description="Qwen3-shaped decoder (embedding, L x [norm, q/k/v, qk-norm, rope, GQA attention, o, norm, "
                "gate/up, swiglu, down], norm, linear_logp): per-token logp and every weight's gradient",
    shape_model=Qwen3Shape,
    inputs=(TokenInput("ids", lambda s: (), index_high=lambda s: s["vocab"]),
            TokenInput("targets", lambda s: (), index_high=lambda s: s["vocab"])),
    params=tuple(_param(w) for w in WEIGHTS),
    outputs=(OutputSpec("logp", lambda s: (), dtype=torch.float32),),
    reference=_reference,
    stock=_stock,
    candidates={"triton.chain": _candidate("triton"), "cuda.chain": _candidate("cuda")},
    backward_scope="layout",
)
