"""attention: causal self-attention per sample with grouped-query heads and a KV cache across calls; gradients
dQ, dK, dV.

Query heads come in groups that share one K/V head (``heads`` a multiple of ``kv_heads``; Qwen3 and Llama 3 use
32 / 8). Chunked prefill and decode see earlier tokens of their sample through the cache, so keys and values of
one call receive gradient from later calls: the backward spans the whole layout.
"""

from __future__ import annotations

from functools import partial

import torch
from pydantic import PositiveInt, model_validator

from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    Candidate,
    Family,
    HeadsShape,
    OpSpec,
    OutputSpec,
    Shape,
    TokenInput,
    head_feature,
    kernel_module,
)
from gradsweep.stock import sdpa as stock_sdpa


class AttentionShape(HeadsShape):
    """heads (query) x head_dim, kv_heads K/V heads (default: heads); hidden, if given, is heads x head_dim."""

    kv_heads: PositiveInt | None = None

    @model_validator(mode="after")
    def _group(self) -> AttentionShape:
        if self.kv_heads is None:
            self.kv_heads = self.heads
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}; set kv_heads to a "
                             "divisor of heads (each K/V head serves heads / kv_heads query heads)")
        return self


def kv_feature(shape: Shape) -> tuple[int, ...]:
    """Per-row shape [kv_heads, head_dim] of a key or value."""
    return (shape.get("kv_heads") or shape["heads"], shape["head_dim"])


def _reference(inputs, params, shape, rows):
    """Float64 causal attention per sample; query head h reads K/V head h // (heads / kv_heads)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    group = q.shape[1] // k.shape[1]
    out = torch.zeros_like(q)
    sample = rows.sample
    for s in torch.unique(sample[sample >= 0]).tolist():
        idx = torch.nonzero(sample == s)[:, 0]
        idx = idx[torch.argsort(rows.position[idx])].to(q.device)
        qs = q[idx].transpose(0, 1)                                       # [heads, n, d]
        ks, vs = (t[idx].repeat_interleave(group, dim=1).transpose(0, 1) for t in (k, v))
        scores = qs @ ks.transpose(-1, -2) / shape["head_dim"] ** 0.5
        n = idx.numel()
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        out[idx] = (probs @ vs).transpose(0, 1)
    return {"o": out}


# ------------------------------------------------------------------------------------------------ stock path
class _StockKV:
    """Per-sample K/V buffers of one layout run (what a static KV cache holds) and their gradient buffers.

    Written in place outside autograd, so the graph never holds a growing copy of the cache: each call's SDPA is
    recomputed in its backward from views of the buffers (activation checkpointing), so what a call saves does
    not grow with the cache, and the backward routes the keys' gradients to the calls that wrote them.
    """

    def __init__(self, lengths, kv_heads: int, dim: int, dtype: torch.dtype, device: torch.device) -> None:
        width = max([1, *lengths])
        self.k = torch.zeros((len(lengths), width, kv_heads, dim), dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.dk = torch.zeros_like(self.k)
        self.dv = torch.zeros_like(self.k)
        self.calls: list[_StockCall] = []


class _StockCall:
    """One call's real segments, K/V inputs, and whether its backward has run (then later gradients go direct)."""

    def __init__(self, segments, k: torch.Tensor, v: torch.Tensor) -> None:
        self.segments = segments
        self.k, self.v = k, v
        self.backward_done = False


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Stock SDPA of one sequence piece: q [n, Hq, d] at positions start.., keys [start + n, Hkv, d] from 0."""
    n, total = q.shape[0], k.shape[0]
    qb, kb, vb = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    if start == 0:
        o = stock_sdpa(qb, kb, vb, is_causal=True, enable_gqa=True)
    elif n == 1:  # one new token sees every key so far
        o = stock_sdpa(qb, kb, vb, enable_gqa=True)
    else:  # queries at the end of the keys: causal aligned to the bottom right
        mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=total - n)
        o = stock_sdpa(qb, kb, vb, attn_mask=mask, enable_gqa=True)
    return o.squeeze(0).transpose(0, 1)


class _StockAttend(torch.autograd.Function):
    """Plumbing only (the math is stock SDPA): write the call's K/V into the per-sample buffers, attend each
    real segment over its sample's keys so far, and in backward recompute SDPA to route every key's gradient.

    A key's gradient collects in the buffers until its own call's backward returns it (every later call's
    share is in by then when backwards run in reverse). Calls whose backward ran before this call's forward
    (interleaved order) are inputs here, and get this call's share directly.
    """

    @staticmethod
    def forward(ctx, q, k, v, kv: _StockKV, call: _StockCall, earlier: list, *earlier_kv):  # type: ignore[override]
        with torch.no_grad():
            for s, p, n, r in call.segments:  # (sample, start, length, row offset)
                kv.k[s, p:p + n] = k[r:r + n]
                kv.v[s, p:p + n] = v[r:r + n]
            o = torch.zeros_like(q)
            for s, p, n, r in call.segments:
                o[r:r + n] = _sdpa(q[r:r + n], kv.k[s, :p + n], kv.v[s, :p + n], p)
        ctx.save_for_backward(q)
        ctx.kv, ctx.call, ctx.earlier = kv, call, earlier
        return o

    @staticmethod
    def backward(ctx, do):  # type: ignore[override]
        (q,) = ctx.saved_tensors
        kv, call = ctx.kv, ctx.call
        dq = torch.zeros_like(q)
        for s, p, n, r in call.segments:
            with torch.enable_grad():
                qs = q[r:r + n].detach().requires_grad_(True)
                ks = kv.k[s, :p + n].detach().requires_grad_(True)
                vs = kv.v[s, :p + n].detach().requires_grad_(True)
                gq, gk, gv = torch.autograd.grad(_sdpa(qs, ks, vs, p), (qs, ks, vs), do[r:r + n])
            dq[r:r + n] = gq
            kv.dk[s, :p + n] += gk
            kv.dv[s, :p + n] += gv
        grads = [_take(kv, c) for c in (call, *ctx.earlier)]
        call.backward_done = True
        return (dq, *grads[0], None, None, None, *(g for pair in grads[1:] for g in pair))


def _take(kv: _StockKV, call: _StockCall) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient collected for a call's keys and values (its rows), cleared from the buffers."""
    dk, dv = torch.zeros_like(call.k), torch.zeros_like(call.v)
    for s, p, n, r in call.segments:
        dk[r:r + n] = kv.dk[s, p:p + n]
        dv[r:r + n] = kv.dv[s, p:p + n]
        kv.dk[s, p:p + n] = 0
        kv.dv[s, p:p + n] = 0
    return dk, dv


def _stock(ctx: CallContext) -> CallOutput:
    """Stock SDPA (bf16, or FP32 for the accuracy baseline) per sequence piece, K/V of earlier calls from
    preallocated per-sample buffers; GQA through ``enable_gqa`` as users call it. Pads and fillers: zeros."""
    q, k, v = ctx.inputs["q"], ctx.inputs["k"], ctx.inputs["v"]
    kv = ctx.state.get("stock_kv")
    if kv is None:
        kv = ctx.state["stock_kv"] = _StockKV(ctx.lengths, k.shape[1], k.shape[2], k.dtype, k.device)
    segs = tuple((s.sample, s.start, s.length, s.row_offset) for s in ctx.call.segments
                 if s.sample >= 0 and s.length > 0)
    call = _StockCall(segs, k, v)
    done = [c for c in kv.calls if c.backward_done]
    kv.calls.append(call)
    o = _StockAttend.apply(q, k, v, kv, call, done, *[t for c in done for t in (c.k, c.v)])
    return CallOutput({"o": o})


# ------------------------------------------------------------------------------------------------ kernels
def _kernel(ctx: CallContext, family: Family = "triton") -> CallOutput:
    """A family's kernel (Triton, or CUDA C++ with the same API) keeps a logical K/V store and folds dK/dV over
    canonical query tiles across calls."""
    mod = kernel_module(family, "attention")
    q, k = ctx.inputs["q"], ctx.inputs["k"]
    cache = ctx.state.get("cache")
    if cache is None:
        cache = ctx.state["cache"] = mod.AttentionCache(ctx.lengths, q.shape[1], q.shape[2], q.device,
                                                        kv_heads=k.shape[1])
    return CallOutput({"o": mod.attention(q, k, ctx.inputs["v"], ctx.rows, cache)})


def _kernel_grads(state: dict) -> dict[str, torch.Tensor]:
    dk, dv = state["cache"].finish()
    return {"dK": dk, "dV": dv}


OP = OpSpec(
    name="attention",
    description="causal attention per sample (grouped-query heads) with a KV cache across calls; dQ, dK, dV",
    shape_model=AttentionShape,
    inputs=(TokenInput("q", head_feature, grad="dQ"), TokenInput("k", kv_feature, grad="dK"),
            TokenInput("v", kv_feature, grad="dV")),
    params=(),
    outputs=(OutputSpec("o", head_feature),),
    reference=_reference,
    stock=_stock,
    candidates={"triton.attention": Candidate("triton.attention", "triton", _kernel,
                                              folded_input_grads=_kernel_grads),
                "cuda.attention": Candidate("cuda.attention", "cuda", partial(_kernel, family="cuda"),
                                            folded_input_grads=_kernel_grads)},
    backward_scope="layout",
)
