"""attention: causal self-attention per sample, with a KV cache across calls; gradients dQ, dK, dV.

Chunked prefill and decode see earlier tokens of their sample through the cache, so keys and
values of one call receive gradient from later calls: the backward spans the whole layout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gradsweep.ops.base import (
    CallContext,
    CallOutput,
    Candidate,
    HeadsShape,
    OpSpec,
    OutputSpec,
    TokenInput,
    head_feature,
    kernel_module,
    torch_candidate,
)


class AttentionShape(HeadsShape):
    """heads x head_dim (and hidden, if given, must be their product)."""


def _reference(inputs, params, shape, rows):
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    out = torch.empty_like(q)
    sample = rows.sample
    for s in torch.unique(sample).tolist():
        idx = torch.nonzero(sample == s)[:, 0].to(q.device)
        qs, ks, vs = (t[idx].transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
        scores = qs @ ks.transpose(-1, -2) / shape["head_dim"] ** 0.5
        n = idx.numel()
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        out[idx] = (probs @ vs).transpose(0, 1)
    return {"o": out}


def _stock(ctx: CallContext) -> CallOutput:
    """Batched SDPA over the call's sequences, each padded to the call's widest, earlier keys from the cache."""
    q, k, v = ctx.inputs["q"], ctx.inputs["k"], ctx.inputs["v"]
    cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = ctx.state.setdefault("kv", {})
    segs = ctx.call.segments
    width = ctx.call.padded[1] if ctx.call.padded else None
    spans = []
    for b, seg in enumerate(segs):
        first = b * width if width else seg.row_offset
        n = width if width else seg.length
        spans.append((first, n))
    lq = max(n for _, n in spans)
    heads, dim = q.shape[1], q.shape[2]
    keys, vals, kv_lens = [], [], []
    for seg, (first, n) in zip(segs, spans):
        past_k, past_v = cache.get(seg.sample, (k[:0], v[:0])) if seg.sample >= 0 else (k[:0], v[:0])
        keys.append(torch.cat([past_k, k[first:first + n]]))
        vals.append(torch.cat([past_v, v[first:first + n]]))
        kv_lens.append(keys[-1].shape[0])
    lk = max(kv_lens)
    qb = q.new_zeros(len(segs), lq, heads, dim)
    kb = k.new_zeros(len(segs), lk, heads, dim)
    vb = v.new_zeros(len(segs), lk, heads, dim)
    mask = torch.zeros(len(segs), lq, lk, dtype=torch.bool, device=q.device)
    pos = ctx.rows.position.to(q.device)
    real = ctx.rows.sample.to(q.device) >= 0
    for b, (seg, (first, n)) in enumerate(zip(segs, spans)):
        qb[b, :n] = q[first:first + n]
        kb[b, :kv_lens[b]] = keys[b]
        vb[b, :kv_lens[b]] = vals[b]
        past = kv_lens[b] - n
        key_pos = torch.cat([torch.arange(past, device=q.device), pos[first:first + n]])
        key_ok = torch.cat([torch.ones(past, dtype=torch.bool, device=q.device),
                            real[first:first + n] | (seg.sample < 0)])
        qpos = pos[first:first + n]
        mask[b, :n, :kv_lens[b]] = (key_pos[None, :] <= qpos[:, None]) & key_ok[None, :]
        mask[b, :n, 0] |= ~mask[b, :n].any(-1)  # pad queries: attend somewhere, output ignored
    out = F.scaled_dot_product_attention(qb.transpose(1, 2), kb.transpose(1, 2), vb.transpose(1, 2),
                                         attn_mask=mask[:, None]).transpose(1, 2)
    o = torch.cat([out[b, :n] for b, (_, n) in enumerate(spans)])
    if width is None:
        order = torch.cat([torch.arange(first, first + n) for first, n in spans]).to(q.device)
        o = o[torch.argsort(order)]
    for b, seg in enumerate(segs):
        if seg.sample >= 0:
            cache[seg.sample] = (keys[b], vals[b]) if width is None else _real_kv(keys[b], vals[b], seg, spans[b])
    return CallOutput({"o": o})


def _real_kv(keys: torch.Tensor, vals: torch.Tensor, seg, span: tuple[int, int]):
    """Cache only the real rows of a padded sequence (pads never become context)."""
    first, n = span
    past = keys.shape[0] - n
    lo = past + (seg.row_offset - first)
    keep = torch.cat([torch.arange(past), torch.arange(lo, lo + seg.length)]).to(keys.device)
    return keys[keep], vals[keep]


def _kernel(ctx: CallContext) -> CallOutput:
    """The Triton kernel keeps a logical K/V store and folds dK/dV over query tiles across calls."""
    mod = kernel_module("triton", "attention")
    q = ctx.inputs["q"]
    cache = ctx.state.get("cache")
    if cache is None:
        cache = ctx.state["cache"] = mod.AttentionCache(ctx.lengths, q.shape[1], q.shape[2], q.device)
    return CallOutput({"o": mod.attention(q, ctx.inputs["k"], ctx.inputs["v"], ctx.rows, cache)})


def _kernel_grads(state: dict) -> dict[str, torch.Tensor]:
    dk, dv = state["cache"].finish()
    return {"dK": dk, "dV": dv}


OP = OpSpec(
    name="attention",
    description="causal attention per sample with a KV cache across calls; gradients dQ, dK, dV",
    shape_model=AttentionShape,
    inputs=(TokenInput("q", head_feature, grad="dQ"), TokenInput("k", head_feature, grad="dK"),
            TokenInput("v", head_feature, grad="dV")),
    params=(),
    outputs=(OutputSpec("o", head_feature),),
    reference=_reference,
    candidates={**torch_candidate("attention", _stock),
                "triton.attention": Candidate("triton.attention", "triton", _kernel,
                                              folded_input_grads=_kernel_grads)},
    backward_scope="layout",
)
