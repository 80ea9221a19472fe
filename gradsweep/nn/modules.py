"""Thin modules over one family's kernels: Embedding, RMSNorm, QKNorm, Linear, RoPE, Attention, SwiGLUMLP,
LinearLogp.

Each module is built for one family: ``"triton"`` or ``"cuda"`` (the batch-invariant kernels, through the
custom ops of ``gradsweep.nn.ops``; weight gradients go into the context's folds) or ``"torch"`` (stock
PyTorch ops in the activations' dtype, weight gradients through autograd: the status quo, so the same model
code runs both). A module holds a ``WeightRef`` (a model's weight table, a name, and a layer for weights stored
stacked per layer) and reads rows, folds and caches from the ``ChainContext`` it is called with.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right

from gradsweep.nn import ops
from gradsweep.nn.context import ChainContext
from gradsweep.nn.kernels import KERNEL_FAMILIES
from gradsweep.stock import sdpa as stock_sdpa

FAMILIES = ("torch", *KERNEL_FAMILIES)


def check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"family {family!r}: use one of {', '.join(FAMILIES)}")
    return family


class WeightRef:
    """A module's weight: ``table[name]``, or its ``layer``-th slice when the weight is stored stacked."""

    def __init__(self, table: MutableMapping[str, Tensor], name: str, layer: int | None = None) -> None:
        self.table, self.name, self.layer = table, name, layer

    def get(self) -> Tensor:
        w = self.table[self.name]
        return w if self.layer is None else w[self.layer]

    @property
    def slot(self) -> int:
        """The layer as a custom-op argument (-1: not a per-layer weight)."""
        return -1 if self.layer is None else self.layer


def _grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class _Module(nn.Module):
    def __init__(self, family: str) -> None:
        super().__init__()
        self.family = check_family(family)

    @property
    def stock(self) -> bool:
        return self.family == "torch"

    def extra_repr(self) -> str:
        return f"family={self.family}"


class _Weighted(_Module):
    def __init__(self, family: str, weight: WeightRef) -> None:
        super().__init__(family)
        self.weight = weight

    def _fold_args(self, ctx: ChainContext, grad: bool) -> tuple[int, str, int, bool]:
        """Where the kernel finds its fold: the context, the weight's name and layer; and whether to record."""
        return ctx.id, self.weight.name, self.weight.slot, grad


class Embedding(_Weighted):
    """Token ids [R] -> rows of the table [R, hidden]; dweight folded per vocabulary row in canonical order."""

    def forward(self, ids: Tensor, ctx: ChainContext) -> Tensor:
        w = self.weight.get()
        if self.stock:
            return F.embedding(ids, w)
        return ops.embedding(self.family, ids, w, *self._fold_args(ctx, _grad(w)))[0]


def stock_rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """Hugging Face's Qwen3RMSNorm: normalise in FP32, round to the activation dtype, then scale."""
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class RMSNorm(_Weighted):
    """RMSNorm over the last dimension of x [R, hidden]."""

    def __init__(self, family: str, weight: WeightRef, eps: float) -> None:
        super().__init__(family, weight)
        self.eps = float(eps)

    def forward(self, x: Tensor, ctx: ChainContext) -> Tensor:
        w = self.weight.get()
        if self.stock:
            return stock_rms_norm(x, w, self.eps)
        return ops.rms_norm(self.family, x, w, self.eps, *self._fold_args(ctx, _grad(x, w)))[0]


class QKNorm(RMSNorm):
    """RMSNorm of each head of x [R, heads, head_dim] over head_dim (one weight shared by the heads)."""

    def forward(self, x: Tensor, ctx: ChainContext) -> Tensor:
        w = self.weight.get()
        if self.stock:
            return stock_rms_norm(x, w, self.eps)
        return ops.qk_norm(self.family, x, w, self.eps, *self._fold_args(ctx, _grad(x, w)))[0]


class Linear(_Weighted):
    """y = x @ W^T (no bias); dW folded over canonical token tiles."""

    def forward(self, x: Tensor, ctx: ChainContext) -> Tensor:
        w = self.weight.get()
        if self.stock:
            return F.linear(x, w)
        return ops.linear(self.family, x, w, *self._fold_args(ctx, _grad(x, w)))[0]


class LinearLogp(_Weighted):
    """Selected-token log-prob of ``targets`` under logits = h @ W^T, FP32 [R] (the kernel never
    materialises [R, vocab]; stock computes bf16 logits, then an FP32 log_softmax)."""

    def forward(self, h: Tensor, targets: Tensor, ctx: ChainContext) -> Tensor:
        w = self.weight.get()
        if self.stock:
            logits = F.linear(h, w)
            return torch.log_softmax(logits.float(), -1).gather(-1, targets[:, None])[:, 0]
        return ops.linear_logp(self.family, h, w, targets, *self._fold_args(ctx, _grad(h, w)))[0]


def rope_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Hugging Face's default RoPE tables: FP32 inverse frequencies and angles, cast to the activation dtype."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half_apply(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class RoPE(_Module):
    """Rotate-half rotary embedding of x [R, heads, head_dim] at each row's absolute position."""

    def __init__(self, family: str, head_dim: int, theta: float) -> None:
        super().__init__(family)
        self.head_dim, self.theta = int(head_dim), float(theta)

    def forward(self, x: Tensor, ctx: ChainContext) -> Tensor:
        if self.stock:
            cos, sin = rope_cos_sin(ctx.positions, self.head_dim, self.theta, x.dtype)
            return rotate_half_apply(x, cos, sin)
        return ops.rope(self.family, x, ctx.positions, self.theta, ctx.id, _grad(x))[0]


def _sample_rows(rows, device: torch.device):
    """(sample, its rows of the call on ``device`` in position order, their positions, the first position) for each
    real sample of the call."""
    sample, position = rows.sample, rows.position
    for s in torch.unique(sample[sample >= 0]).tolist():
        idx = torch.nonzero(sample == s)[:, 0]
        idx = idx[torch.argsort(position[idx])]
        first, last = int(position[idx[0]]), int(position[idx[-1]])
        if last - first + 1 != idx.numel():
            raise ValueError(f"attention: sample {s} has {idx.numel()} rows at positions {first}..{last} in one call "
                             "(a call must hand each sample consecutive positions)")
        yield s, idx.to(device), position[idx].to(device), first


def _causal_sdpa(q: Tensor, keys: Tensor, vals: Tensor, first: int) -> Tensor:
    """Stock SDPA of one sample's query rows (consecutive positions from ``first``) over its keys so far (the
    ``first`` cached ones, then the rows' own), causal, GQA: [rows, heads, d].

    A continuation (``first`` > 0) is causal aligned to the last key (``causal_lower_right``), not an explicit
    boolean mask: SDPA takes a mask with ``enable_gqa`` only in its math kernel, which saves each call's K / V
    expanded to every query head for the backward. Over a stock decode (one call per token) that is ~8 KB x L^2
    per layer for a sample of L tokens, ~33 GB for the release chain's two layers, which ran an 80 GB card out of
    memory. The flash kernel takes the same causal pattern with GQA natively; the attention computed is the
    same (key j is visible to the row at position p exactly when j <= p)."""
    qs, ks, vs = (t.transpose(0, 1)[None] for t in (q, keys, vals))
    if keys.shape[0] != first + q.shape[0]:
        raise ValueError(f"attention: {keys.shape[0]} keys for {q.shape[0]} rows after {first} cached ones")
    if first == 0:
        o = stock_sdpa(qs, ks, vs, is_causal=True, enable_gqa=True)
    else:
        o = stock_sdpa(qs, ks, vs, attn_mask=causal_lower_right(q.shape[0], keys.shape[0]), enable_gqa=True)
    return o[0].transpose(0, 1)


class Attention(_Module):
    """Causal attention of each row over its sample's keys so far (earlier calls' keys through the layer's cache),
    grouped-query: q [R, heads, d], k / v [R, kv_heads, d] with heads a multiple of kv_heads.

    Kernel families: the batch-invariant kernel; in layerwise mode this is the graph cut where the step's
    backward waits for every call (see ``layerwise.py``). Stock: SDPA per sample over a tensor KV cache that
    stays in the autograd graph (what a trainer gets from PyTorch today).
    """

    def __init__(self, family: str, layer: int) -> None:
        super().__init__(family)
        self.layer = int(layer)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, ctx: ChainContext) -> Tensor:
        if self.stock and ctx.recording:
            from gradsweep.nn.layerwise import AttentionCut

            call = StockAttentionCall(self, q, k, v, ctx)
            leaf = call.o.detach().requires_grad_(True)
            ctx.current.cuts.append(AttentionCut((q, k, v), call, leaf))
            return leaf
        if self.stock:
            return self._stock(q, k, v, ctx)
        if ctx.recording:
            from gradsweep.nn.layerwise import AttentionCut

            call = ops.attention_call(ctx, self.family, self.layer, q, k, v, grad=True)
            leaf = call.o.detach().requires_grad_(True)
            ctx.current.cuts.append(AttentionCut((q, k, v), call, leaf))
            return leaf
        return ops.attention(self.family, q, k, v, ctx.id, self.layer, _grad(q, k, v))[0]

    def _stock(self, q: Tensor, k: Tensor, v: Tensor, ctx: ChainContext) -> Tensor:
        cache: dict[int, tuple[Tensor, Tensor]] = ctx.state.setdefault(f"kv{self.layer}", {})
        out = torch.zeros_like(q)
        for s, dev_idx, _, first in _sample_rows(ctx.rows, q.device):
            past_k, past_v = cache.get(s, (k[:0], v[:0]))
            if past_k.shape[0] != first:
                raise ValueError(f"attention: sample {s} starts at position {first} with "
                                 f"{past_k.shape[0]} cached keys (calls of a sample must come in position order)")
            keys, vals = torch.cat([past_k, k[dev_idx]]), torch.cat([past_v, v[dev_idx]])
            cache[s] = (keys, vals)
            out = out.index_put((dev_idx,), _causal_sdpa(q[dev_idx], keys, vals, first))
        return out

    def stock_keys(self, ctx: ChainContext, sample: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """Layerwise stock step: the layer's keys and values of ``sample``, one leaf each over the whole sample."""
        store: dict[int, tuple[Tensor, Tensor]] = ctx.state.setdefault(f"kv_leaves{self.layer}", {})
        if sample not in store:
            shape = (ctx.lengths[sample], *like.shape[1:])
            store[sample] = tuple(torch.zeros(shape, dtype=like.dtype, device=like.device).requires_grad_(True)
                                  for _ in range(2))
        return store[sample]


class StockAttentionCall:
    """Stock attention of one call in a layerwise step (a step whose tokens come in several calls).

    Autograd through a tensor KV cache makes each call's backward run back through every earlier call's graph:
    O(calls^2), which at release shapes (1031 decode calls) does not finish. Here the keys and values of each
    sample are one leaf per layer, filled as calls arrive; every call's SDPA reads a prefix of it, so a call's
    backward stops at the leaves, and the layer's dK / dV of a call's rows are read from the leaves' gradients
    once every call's attention backward of the layer has run (the ``AttentionCut`` protocol). The forward does
    the same SDPA on the same values as the ordinary stock path.
    """

    def __init__(self, attn: Attention, q: Tensor, k: Tensor, v: Tensor, ctx: ChainContext) -> None:
        self.q = q.detach().requires_grad_(True)
        self.kv: list[tuple[int, Tensor, Tensor]] = []  # (sample, its rows in this call, their positions)
        out = torch.zeros_like(q)
        self.leaves: dict[int, tuple[Tensor, Tensor]] = {}
        with torch.enable_grad():
            for s, dev_idx, pos, first in _sample_rows(ctx.rows, q.device):
                keys, vals = attn.stock_keys(ctx, s, k)
                end = first + int(dev_idx.shape[0])
                filled = ctx.state.setdefault(f"kv_filled{attn.layer}", {})
                if first != filled.get(s, 0):  # (the rows' positions are consecutive: ``_sample_rows``)
                    raise ValueError(f"attention: sample {s} continues at position {first} after {filled.get(s, 0)} "
                                     "cached keys (calls of a sample must come in position order, without gaps)")
                filled[s] = end
                keys.data[first:end] = k[dev_idx].detach()  # new positions only: what earlier calls read stays
                vals.data[first:end] = v[dev_idx].detach()
                self.leaves[s] = (keys, vals)
                self.kv.append((s, dev_idx, pos))
                out = out.index_put((dev_idx,), _causal_sdpa(self.q[dev_idx], keys[:end], vals[:end], first))
        self.o = out
        self.k_like, self.v_like = k, v

    def backward_q(self, do: Tensor) -> Tensor:
        """dQ of this call's rows; the gradients of every key and value it read accumulate in the leaves."""
        torch.autograd.backward(self.o, do)
        dq = self.q.grad if self.q.grad is not None else torch.zeros_like(self.q)
        self.q, self.o = None, None
        return dq

    def kv_grads(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """dK, dV of this call's rows (pads and fillers: zero) from the leaves, once every call's backward_q ran."""
        dk = torch.zeros(self.k_like.shape, dtype=dtype, device=self.k_like.device)
        dv = torch.zeros(self.v_like.shape, dtype=dtype, device=self.v_like.device)
        for s, dev_idx, pos in self.kv:
            keys, vals = self.leaves[s]
            for full, g in ((keys, dk), (vals, dv)):
                if full.grad is not None:
                    g[dev_idx] = full.grad.index_select(0, pos).to(dtype)
        return dk, dv


class _FanOut(torch.autograd.Function):
    """One activation read by several modules; its gradient is their sum in a fixed order, in FP32, rounded
    once (autograd would add them in whatever order its scheduler reaches the readers)."""

    @staticmethod
    def forward(ctx, x: Tensor, n: int):  # type: ignore[override]
        ctx.dtype = x.dtype
        return tuple(x.view_as(x) for _ in range(n))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        acc = None
        for g in grads:
            if g is not None:
                acc = g.float() if acc is None else acc + g.float()
        return (None if acc is None else acc.to(ctx.dtype)), None


def fan_out(x: Tensor, n: int, family: str) -> tuple[Tensor, ...]:
    """``n`` readers of ``x``: stock torch lets autograd sum their gradients; kernel families sum in fixed order."""
    if family == "torch" or not x.requires_grad:
        return (x,) * n
    return _FanOut.apply(x, n)


class SwiGLUMLP(_Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, family: str, gate: WeightRef, up: WeightRef, down: WeightRef) -> None:
        super().__init__(family)
        self.gate, self.up, self.down = Linear(family, gate), Linear(family, up), Linear(family, down)

    def forward(self, x: Tensor, ctx: ChainContext) -> Tensor:
        xg, xu = fan_out(x, 2, self.family)
        g, u = self.gate(xg, ctx), self.up(xu, ctx)
        if self.stock:
            a = F.silu(g) * u
        else:
            a = ops.swiglu(self.family, g, u, ctx.id, _grad(g, u))[0]
        return self.down(a, ctx)
