"""The layerwise backward of a step whose tokens reach the model in several calls.

Why it exists: attention folds dK/dV over the canonical query tiles of the *whole step* (DESIGN.md), so a
layer's dK/dV are final only after every call's attention backward of that layer has run. When a step spans
several calls (chunked prefill through the KV cache, one call per sample, decode, regrouped neighbours, a
shared prefix), no call's K/V projection can be backpropagated before every call's attention of that layer
has been, and autograd, which backpropagates one call's graph at a time, cannot order that.

So in layerwise mode each call's forward is recorded as segments separated by **cuts**: a ``BoundaryCut``
at each layer input (the hidden state becomes a fresh leaf) and an ``AttentionCut`` at each attention (q, k, v
are sinks, the output a fresh leaf). The call's output is wrapped by a node whose backward only stashes the
upstream gradient. When every token of the step has been forwarded and every call's upstream gradient has
arrived (whatever order the caller's backwards ran in: all at once, reverse call order, or interleaved with
the forwards), the step's backward runs here, cut by cut from the last, over all calls:

- a boundary cut hands its leaf's gradient (the sum of what the segments after it produced) to the tensor it
  cut, and backpropagates the segment before it;
- an attention cut first runs every call's dQ (each call's query tiles join the layer's dK/dV fold), then,
  the fold complete, hands each call dQ, dK, dV for its rows and backpropagates the segment before it.

Every kernel sees the same rows as in an ordinary backward; the folds make the order of calls irrelevant to
the bits, so a layerwise step gives the bits an ordinary one-call step gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from gradsweep.nn.context import CallRecord, ChainContext
from gradsweep.nn.kernels import AttentionCall


@dataclass
class BoundaryCut:
    sink: Tensor
    leaf: Tensor


@dataclass
class AttentionCut:
    sinks: tuple[Tensor, Tensor, Tensor]
    call: AttentionCall
    leaf: Tensor


class _StashGrad(torch.autograd.Function):
    """The call's output as the caller sees it: its backward records the upstream gradient, then runs the
    step's layerwise backward once the last call's gradient is in.

    Its only autograd input is a private anchor leaf, never the recorded graph: the engine would otherwise run
    that graph at once with zero gradients (it materialises the None this node returns).
    """

    @staticmethod
    def forward(ctx, anchor: Tensor, logp: Tensor, chain: ChainContext, record: CallRecord):  # type: ignore[override]
        ctx.chain, ctx.record = chain, record
        return logp.detach().clone()

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        record: CallRecord = ctx.record
        if record.grad is not None:
            raise RuntimeError("layerwise: a call's output received a second backward")
        record.grad = g.detach()
        chain: ChainContext = ctx.chain
        if chain.all_forwarded and all(r.grad is not None for r in chain.calls):
            run_step_backward(chain)
        return None, None, None, None


_ANCHOR = "layerwise_anchor"


def attach_output(chain: ChainContext, logp: Tensor) -> Tensor:
    if not logp.requires_grad:
        raise RuntimeError("layerwise: the call's output has no gradient path")
    record = chain.current
    record.output = logp
    anchor = chain.state.setdefault(_ANCHOR, torch.zeros((), requires_grad=True))
    return _StashGrad.apply(anchor, logp.detach(), chain, record)


def _backprop(outputs: Sequence[Tensor], grads: Sequence[Tensor]) -> None:
    pairs = [(o, g) for o, g in zip(outputs, grads) if o.requires_grad]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


def _leaf_grad(leaf: Tensor) -> Tensor:
    g = leaf.grad
    leaf.grad = None
    return torch.zeros_like(leaf) if g is None else g


def run_step_backward(chain: ChainContext) -> None:
    """Backpropagate every call of the step, cut by cut from the last, all calls at each attention cut."""
    if chain.backward_done:
        raise RuntimeError("layerwise: the step's backward already ran")
    chain.backward_done = True
    calls = list(reversed(chain.calls))  # any order gives the same bits; reverse is what autograd would do
    n_cuts = {len(r.cuts) for r in calls}
    if len(n_cuts) != 1:
        raise RuntimeError(f"layerwise: calls recorded different numbers of cuts {sorted(n_cuts)}")
    for r in calls:
        _backprop([r.output], [r.grad])
        r.output = None
    for j in reversed(range(n_cuts.pop())):
        cuts = [r.cuts[j] for r in calls]
        if isinstance(cuts[0], BoundaryCut):
            for cut in cuts:
                _backprop([cut.sink], [_leaf_grad(cut.leaf)])
        else:
            dqs = [cut.call.backward_q(_leaf_grad(cut.leaf)) for cut in cuts]
            for cut, dq in zip(cuts, dqs):
                q, k, v = cut.sinks
                dk, dv = cut.call.kv_grads(k.dtype)
                _backprop([q, k, v], [dq, dk, dv])
        for r in calls:
            r.cuts[j] = None  # free the segment as soon as it is done
