"""The kernels as ``torch.library`` custom ops (``torch.ops.gradsweep.*``), with fake implementations.

Why custom ops: ``torch.compile(fullgraph=True)`` must trace a model built from gradsweep.nn without a graph
break. A kernel call needs Python state a graph cannot carry (the call's ``RowIdentity``, the parameter's
``CanonicalFold`` with the rows it carries between calls, the layer's ``AttentionCache``), so each op is an
opaque node whose arguments are tensors and constants only:

- ``ctx`` (int) names the live ``ChainContext``; ``param`` / ``layer`` name the fold inside it. The context
  and its folds are built before the compiled region runs, and the op reads the current call's rows from it
  at run time. That is the compile boundary: everything whose arithmetic matters runs inside the kernels,
  everything host-side (fold plans, row grouping) inside the op, none of it in the traced graph.
- The forward runs the family's public kernel function (its own autograd Function) on detached leaves under
  ``enable_grad`` and stashes that little graph in the context; it returns the output and a **token** (an
  int64 tensor naming the stash). The backward op takes the token and the upstream gradient, runs the
  kernel's backward (which folds the weight gradient into the fold's FP32 main grad in canonical order) and
  returns the activation gradients.
- Weight gradients are never returned: they live in the folds' main grads, outside any op's arguments. So the
  backward ops that fold (and attention's, which also writes the layer's stores) are registered as *ordered
  effects*: a compiler keeps each of them, even the embedding's, which returns nothing, and never reorders
  them. (Declaring the main grad a mutated argument instead does not work: functionalization hands the op a
  copy and writes that copy back over the fold's result.)

The stock ``torch`` flavour does not go through these ops (it is plain PyTorch, traced natively).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch._higher_order_ops.effects import _EffectType

from gradsweep.nn.context import NO_TOKEN, ChainContext, Stashed, context_of
from gradsweep.nn.kernels import AttentionCall, kernel_module, new_attention_cache

_NS = "gradsweep"


def _layer(layer: int) -> int | None:
    return None if layer < 0 else layer


def _no_token() -> Tensor:
    return torch.full((1,), NO_TOKEN, dtype=torch.int64)


def _token_like() -> Tensor:
    return torch.empty(1, dtype=torch.int64)


def _run(c: ChainContext, grad: bool, param: str | None, fn: Callable[..., Tensor],
         activations: Sequence[Tensor], weight: Tensor | None, folds: bool) -> tuple[Tensor, Tensor]:
    """Run a kernel on detached leaves; with ``grad`` keep its autograd graph in the stash (token)."""
    with torch.enable_grad() if grad else torch.no_grad():
        leaves = [a.detach().requires_grad_(grad) for a in activations]
        w = () if weight is None else (weight.detach().requires_grad_(grad and folds),)
        out = fn(*leaves, *w)
    if not grad:
        return out, _no_token()
    token = c.stash(Stashed((out,), tuple(leaves), param))
    return out.detach(), token


def _backward_of(ctx: int, token: Tensor, dy: Tensor) -> tuple[ChainContext, Stashed]:
    c = context_of(ctx)
    entry = c.unstash(token)
    torch.autograd.backward(entry.outputs, (dy,))
    c.settle(entry.param)
    return c, entry


def _grad_of(leaf: Tensor, like: Tensor) -> Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(like)


@torch.library.custom_op(f"{_NS}::fold_backward", mutates_args=())
def fold_backward(ctx: int, token: Tensor, dy: Tensor, like: Tensor) -> Tensor:
    """Backward of a stashed one-input kernel call: its input's gradient out, the weight's folded (side effect)."""
    _, entry = _backward_of(ctx, token, dy)
    return _grad_of(entry.leaves[0], like)


@fold_backward.register_fake
def _(ctx, token, dy, like):
    return torch.empty_like(like)


@torch.library.custom_op(f"{_NS}::embedding_backward", mutates_args=())
def embedding_backward(ctx: int, token: Tensor, dy: Tensor) -> None:
    """The embedding's only gradient is its table's, folded into the main grad: an effect and nothing else."""
    _backward_of(ctx, token, dy)


@embedding_backward.register_fake
def _(ctx, token, dy):
    return None


@torch.library.custom_op(f"{_NS}::pair_backward", mutates_args=())
def pair_backward(ctx: int, token: Tensor, dy: Tensor, a_like: Tensor, b_like: Tensor) -> tuple[Tensor, Tensor]:
    """Backward of a stashed two-input elementwise kernel call (swiglu)."""
    _, entry = _backward_of(ctx, token, dy)
    return _grad_of(entry.leaves[0], a_like), _grad_of(entry.leaves[1], b_like)


@pair_backward.register_fake
def _(ctx, token, dy, a_like, b_like):
    return torch.empty_like(a_like), torch.empty_like(b_like)


def _register_autograd(op, activation_slots: Sequence[int], ctx_slot: int, n_inputs: int) -> None:
    """The backward formula of a folding / elementwise op: one backward-op call on the stash token."""

    def setup_context(ctx, inputs, output):
        ctx.ctx_id = inputs[ctx_slot]
        ctx.save_for_backward(output[1], *(inputs[i] for i in activation_slots))

    def backward(ctx, dy, _dtoken):
        token, *likes = ctx.saved_tensors
        if not likes:
            embedding_backward(ctx.ctx_id, token, dy)
            grads: tuple[Tensor, ...] = ()
        elif len(likes) == 1:
            grads = (fold_backward(ctx.ctx_id, token, dy, likes[0]),)
        else:
            grads = pair_backward(ctx.ctx_id, token, dy, likes[0], likes[1])
        out: list[Tensor | None] = [None] * n_inputs
        for slot, g in zip(activation_slots, grads):
            out[slot] = g
        return tuple(out)

    op.register_autograd(backward, setup_context=setup_context)


# --------------------------------------------------------------------------------------------- folding ops
@torch.library.custom_op(f"{_NS}::embedding", mutates_args=())
def embedding(family: str, ids: Tensor, weight: Tensor, ctx: int, param: str, layer: int,
              grad: bool) -> tuple[Tensor, Tensor]:
    c = context_of(ctx)
    mod = kernel_module(family, "embedding")
    fold = c.fold(param, _layer(layer)) if grad else None
    return _run(c, grad, param, lambda w: mod.embedding(ids, w, c.rows, fold), (), weight, fold is not None)


@embedding.register_fake
def _(family, ids, weight, ctx, param, layer, grad):
    return weight.new_empty((ids.shape[0], weight.shape[1])), _token_like()


_register_autograd(embedding, (), ctx_slot=3, n_inputs=7)


def _norm_op(kernel: str):
    @torch.library.custom_op(f"{_NS}::{kernel}", mutates_args=())
    def op(family: str, x: Tensor, weight: Tensor, eps: float, ctx: int, param: str, layer: int,
           grad: bool) -> tuple[Tensor, Tensor]:
        c = context_of(ctx)
        mod = kernel_module(family, kernel)
        fold = c.fold(param, _layer(layer)) if grad else None
        fn = getattr(mod, kernel)
        return _run(c, grad, param, lambda xl, w: fn(xl, w, eps, c.rows, fold), (x,), weight, fold is not None)

    @op.register_fake
    def _(family, x, weight, eps, ctx, param, layer, grad):
        return torch.empty_like(x), _token_like()

    _register_autograd(op, (1,), ctx_slot=4, n_inputs=8)
    return op


rms_norm = _norm_op("rms_norm")
qk_norm = _norm_op("qk_norm")


@torch.library.custom_op(f"{_NS}::linear", mutates_args=())
def linear(family: str, x: Tensor, weight: Tensor, ctx: int, param: str, layer: int,
           grad: bool) -> tuple[Tensor, Tensor]:
    c = context_of(ctx)
    mod = kernel_module(family, "linear")
    fold = c.fold(param, _layer(layer)) if grad else None
    return _run(c, grad, param, lambda xl, w: mod.det_linear(xl, w, c.rows, fold), (x,), weight, fold is not None)


@linear.register_fake
def _(family, x, weight, ctx, param, layer, grad):
    return x.new_empty((x.shape[0], weight.shape[0])), _token_like()


_register_autograd(linear, (1,), ctx_slot=3, n_inputs=7)


@torch.library.custom_op(f"{_NS}::linear_logp", mutates_args=())
def linear_logp(family: str, hidden: Tensor, weight: Tensor, targets: Tensor, ctx: int, param: str, layer: int,
                grad: bool) -> tuple[Tensor, Tensor]:
    c = context_of(ctx)
    mod = kernel_module(family, "linear_logp")
    fold = c.fold(param, _layer(layer)) if grad else None
    return _run(c, grad, param, lambda h, w: mod.linear_logp(h, w, targets, c.rows, fold), (hidden,), weight,
                fold is not None)


@linear_logp.register_fake
def _(family, hidden, weight, targets, ctx, param, layer, grad):
    return hidden.new_empty((hidden.shape[0],), dtype=torch.float32), _token_like()


_register_autograd(linear_logp, (1,), ctx_slot=4, n_inputs=8)


# ------------------------------------------------------------------------------------------ elementwise ops
@torch.library.custom_op(f"{_NS}::rope", mutates_args=())
def rope(family: str, x: Tensor, positions: Tensor, theta: float, ctx: int, grad: bool) -> tuple[Tensor, Tensor]:
    mod = kernel_module(family, "rope")
    return _run(context_of(ctx), grad, None, lambda xl: mod.rope(xl, positions, theta), (x,), None, False)


@rope.register_fake
def _(family, x, positions, theta, ctx, grad):
    return torch.empty_like(x), _token_like()


_register_autograd(rope, (1,), ctx_slot=4, n_inputs=6)


@torch.library.custom_op(f"{_NS}::swiglu", mutates_args=())
def swiglu(family: str, gate: Tensor, up: Tensor, ctx: int, grad: bool) -> tuple[Tensor, Tensor]:
    mod = kernel_module(family, "swiglu")
    return _run(context_of(ctx), grad, None, mod.swiglu, (gate, up), None, False)


@swiglu.register_fake
def _(family, gate, up, ctx, grad):
    return torch.empty_like(gate), _token_like()


_register_autograd(swiglu, (1, 2), ctx_slot=3, n_inputs=5)


# --------------------------------------------------------------------------------------------------- attention
@torch.library.custom_op(f"{_NS}::attention", mutates_args=())
def attention(family: str, q: Tensor, k: Tensor, v: Tensor, ctx: int, layer: int,
              grad: bool) -> tuple[Tensor, Tensor]:
    c = context_of(ctx)
    call = attention_call(c, family, layer, q, k, v, grad)
    if not grad:
        return call.o, _no_token()
    return call.o.detach(), c.stash(Stashed((), (), None, payload=call))


@attention.register_fake
def _(family, q, k, v, ctx, layer, grad):
    return torch.empty_like(q), _token_like()


@torch.library.custom_op(f"{_NS}::attention_backward", mutates_args=())
def attention_backward(ctx: int, token: Tensor, do: Tensor, k_like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """dQ now; dK/dV from the layer's fold, which one call completes only when it holds every token."""
    call: AttentionCall = context_of(ctx).unstash(token).payload
    dq = call.backward_q(do)
    dk, dv = call.kv_grads(k_like.dtype)
    return dq, dk, dv


@attention_backward.register_fake
def _(ctx, token, do, k_like):
    return torch.empty_like(do), torch.empty_like(k_like), torch.empty_like(k_like)


def _attention_setup(ctx, inputs, output):
    ctx.ctx_id = inputs[4]
    ctx.save_for_backward(output[1], inputs[2])


def _attention_bwd(ctx, do, _dtoken):
    token, k_like = ctx.saved_tensors
    dq, dk, dv = attention_backward(ctx.ctx_id, token, do, k_like)
    return None, dq, dk, dv, None, None, None


attention.register_autograd(_attention_bwd, setup_context=_attention_setup)


def attention_call(c: ChainContext, family: str, layer: int, q: Tensor, k: Tensor, v: Tensor,
                   grad: bool) -> AttentionCall:
    """The layer's attention over the current call's rows (its cache made on first use)."""
    mod = kernel_module(family, "attention")
    cache = c.attention_cache(layer, lambda: new_attention_cache(mod, c.lengths, q.shape[1], k.shape[1],
                                                                 q.shape[2], q.device))
    return AttentionCall(mod, cache, q, k, v, c.rows, c.starts, grad)


# The backward ops act on state outside their arguments (folds into main grads, the attention cache): ordered
# effects, so a compiler keeps every one of them (even one that returns nothing) in program order.
for _name in ("fold_backward", "embedding_backward", "attention_backward"):
    torch.library._register_effectful_op(f"{_NS}::{_name}", _EffectType.ORDERED)
