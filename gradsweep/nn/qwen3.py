"""A Qwen3-shaped decoder built only from gradsweep.nn modules, and its FP64 reference.

embedding -> L x [rms_norm -> q/k/v projections -> qk_norm -> rope -> attention (GQA) -> o projection ->
residual -> rms_norm -> gate/up -> swiglu -> down -> residual] -> rms_norm -> linear_logp.

Weights are named once (``WEIGHTS``) and per-layer weights are stored stacked ``[layers, ...]``: the set of
names does not depend on the depth, so the sweep's ``chain`` op declares them as data and every gradient has
a stable name (``d`` + weight name). ``hf.py`` maps a Hugging Face Qwen3 state dict onto these names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass

import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator
from torch import Tensor, nn

from gradsweep.canonical import RowIdentity
from gradsweep.nn.context import ChainContext
from gradsweep.nn.kernels import fold_tile
from gradsweep.nn.modules import (
    Attention,
    Embedding,
    Linear,
    LinearLogp,
    QKNorm,
    RMSNorm,
    RoPE,
    SwiGLUMLP,
    WeightRef,
    check_family,
    fan_out,
)


class Qwen3Shape(BaseModel):
    """Shape of the decoder (defaults: a tiny CPU-sized one). Qwen3-8B: hidden 4096, heads 32, kv_heads 8,
    head_dim 128, intermediate 12288, vocab 151936, layers 36, eps 1e-6, rope_theta 1e6."""

    model_config = ConfigDict(extra="forbid")
    hidden: PositiveInt = 32
    heads: PositiveInt = 4
    kv_heads: PositiveInt = 2
    head_dim: PositiveInt = 16
    intermediate: PositiveInt = 64
    vocab: PositiveInt = 96
    layers: PositiveInt = 2
    eps: float = Field(1e-6, gt=0)
    rope_theta: float = Field(1.0e6, gt=1.0)

    @model_validator(mode="after")
    def _consistent(self) -> Qwen3Shape:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}; "
                             "make kv_heads divide heads (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} is odd; rotate-half RoPE needs an even head_dim")
        return self


@dataclass(frozen=True)
class WeightSpec:
    """One weight: per-layer shape, whether it is stacked per layer, the op whose fold takes its gradient,
    the draw the sweep uses (offset + scale * unit-variance uniform) and its Hugging Face name."""

    name: str
    shape: Callable[[Qwen3Shape], tuple[int, ...]]
    per_layer: bool
    op: str
    hf: str
    scale: Callable[[Qwen3Shape], float] = lambda s: 1.0
    offset: float = 0.0

    def full_shape(self, s: Qwen3Shape) -> tuple[int, ...]:
        return (s.layers, *self.shape(s)) if self.per_layer else self.shape(s)


def _norm(name: str, hf: str, dim: Callable[[Qwen3Shape], int], per_layer: bool, op: str = "rms_norm") -> WeightSpec:
    return WeightSpec(name, lambda s: (dim(s),), per_layer, op, hf, lambda s: 0.1, 1.0)


def _proj(name: str, hf: str, out: Callable[[Qwen3Shape], int], inp: Callable[[Qwen3Shape], int]) -> WeightSpec:
    return WeightSpec(name, lambda s: (out(s), inp(s)), True, "linear", hf, lambda s: inp(s) ** -0.5)


def _q(s: Qwen3Shape) -> int:
    return s.heads * s.head_dim


def _kv(s: Qwen3Shape) -> int:
    return s.kv_heads * s.head_dim


_L = "model.layers.{}."
WEIGHTS: tuple[WeightSpec, ...] = (
    WeightSpec("embed_tokens", lambda s: (s.vocab, s.hidden), False, "embedding", "model.embed_tokens.weight"),
    _norm("input_norm", _L + "input_layernorm.weight", lambda s: s.hidden, True),
    _proj("q_proj", _L + "self_attn.q_proj.weight", _q, lambda s: s.hidden),
    _proj("k_proj", _L + "self_attn.k_proj.weight", _kv, lambda s: s.hidden),
    _proj("v_proj", _L + "self_attn.v_proj.weight", _kv, lambda s: s.hidden),
    _norm("q_norm", _L + "self_attn.q_norm.weight", lambda s: s.head_dim, True, "qk_norm"),
    _norm("k_norm", _L + "self_attn.k_norm.weight", lambda s: s.head_dim, True, "qk_norm"),
    _proj("o_proj", _L + "self_attn.o_proj.weight", lambda s: s.hidden, _q),
    _norm("post_attn_norm", _L + "post_attention_layernorm.weight", lambda s: s.hidden, True),
    _proj("gate_proj", _L + "mlp.gate_proj.weight", lambda s: s.intermediate, lambda s: s.hidden),
    _proj("up_proj", _L + "mlp.up_proj.weight", lambda s: s.intermediate, lambda s: s.hidden),
    _proj("down_proj", _L + "mlp.down_proj.weight", lambda s: s.hidden, lambda s: s.intermediate),
    _norm("final_norm", "model.norm.weight", lambda s: s.hidden, False),
    WeightSpec("lm_head", lambda s: (s.vocab, s.hidden), False, "linear_logp", "lm_head.weight",
               lambda s: s.hidden ** -0.5),
)
WEIGHT_NAMES: tuple[str, ...] = tuple(w.name for w in WEIGHTS)
LAYERED: tuple[str, ...] = tuple(w.name for w in WEIGHTS if w.per_layer)


def weight_spec(name: str) -> WeightSpec:
    return next(w for w in WEIGHTS if w.name == name)


def fold_tiles(family: str) -> dict[str, int]:
    """Canonical tile of each weight's fold in a kernel family."""
    return {w.name: fold_tile(family, w.op) for w in WEIGHTS}


def init_weights(shape: Qwen3Shape, seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str = "cpu") -> dict[str, nn.Parameter]:
    """Random weights (offset + scale * uniform of unit variance), as parameters."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    out = {}
    for w in WEIGHTS:
        u = (torch.rand(w.full_shape(shape), generator=gen, dtype=torch.float32) * 2 - 1) * math.sqrt(3.0)
        out[w.name] = nn.Parameter((w.offset + w.scale(shape) * u).to(dtype).to(device))
    return out


def new_context(shape: Qwen3Shape, lengths, device, main_grads: Mapping[str, Tensor] | None = None,
                family: str = "triton", mode: str = "auto") -> ChainContext:
    """A training step's context with one fold per weight (FP32 main grads: given, else zeros)."""
    from gradsweep.canonical import CanonicalFold

    folds = {}
    if family != "torch":
        tiles = fold_tiles(family)
        for w in WEIGHTS:
            mg = main_grads[w.name] if main_grads is not None else torch.zeros(w.full_shape(shape),
                                                                               dtype=torch.float32, device=device)
            folds[w.name] = CanonicalFold(mg, lengths, tiles[w.name])
    return ChainContext(lengths, device, folds, LAYERED, shape.layers,
                        mode="ordinary" if family == "torch" and mode == "auto" else mode)


class Qwen3Attention(nn.Module):
    def __init__(self, s: Qwen3Shape, family: str, table: MutableMapping[str, Tensor], layer: int) -> None:
        super().__init__()
        self.s, self.family = s, family
        self.q_proj = Linear(family, WeightRef(table, "q_proj", layer))
        self.k_proj = Linear(family, WeightRef(table, "k_proj", layer))
        self.v_proj = Linear(family, WeightRef(table, "v_proj", layer))
        self.q_norm = QKNorm(family, WeightRef(table, "q_norm", layer), s.eps)
        self.k_norm = QKNorm(family, WeightRef(table, "k_norm", layer), s.eps)
        self.rope = RoPE(family, s.head_dim, s.rope_theta)
        self.attention = Attention(family, layer)
        self.o_proj = Linear(family, WeightRef(table, "o_proj", layer))

    def forward(self, x: Tensor, ctx: ChainContext) -> Tensor:
        s, r = self.s, x.shape[0]
        xq, xk, xv = fan_out(x, 3, self.family)
        q = self.q_norm(self.q_proj(xq, ctx).view(r, s.heads, s.head_dim), ctx)
        k = self.k_norm(self.k_proj(xk, ctx).view(r, s.kv_heads, s.head_dim), ctx)
        v = self.v_proj(xv, ctx).view(r, s.kv_heads, s.head_dim)
        o = self.attention(self.rope(q, ctx), self.rope(k, ctx), v, ctx)
        return self.o_proj(o.reshape(r, s.heads * s.head_dim), ctx)


class Qwen3Layer(nn.Module):
    def __init__(self, s: Qwen3Shape, family: str, table: MutableMapping[str, Tensor], layer: int) -> None:
        super().__init__()
        self.input_norm = RMSNorm(family, WeightRef(table, "input_norm", layer), s.eps)
        self.attn = Qwen3Attention(s, family, table, layer)
        self.post_attn_norm = RMSNorm(family, WeightRef(table, "post_attn_norm", layer), s.eps)
        self.mlp = SwiGLUMLP(family, WeightRef(table, "gate_proj", layer), WeightRef(table, "up_proj", layer),
                             WeightRef(table, "down_proj", layer))

    def forward(self, h: Tensor, ctx: ChainContext) -> Tensor:
        h = ctx.cut(h)
        h = h + self.attn(self.input_norm(h, ctx), ctx)
        return h + self.mlp(self.post_attn_norm(h, ctx), ctx)


class Qwen3Decoder(nn.Module):
    """The decoder for one family: ``logp = model(ids, targets, ctx)`` gives each row's log-prob of its target.

    ``weights`` maps every name of ``WEIGHTS`` to a tensor of its ``full_shape`` (per-layer weights stacked);
    the model reads them at call time, so a caller may hand in its own tensors (the sweep's parameters).
    """

    def __init__(self, shape: Qwen3Shape, family: str, weights: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.shape, self.family = shape, check_family(family)
        missing = [w.name for w in WEIGHTS if w.name not in weights]
        if missing:
            raise ValueError(f"Qwen3Decoder: no weight for {', '.join(missing)}")
        for w in WEIGHTS:
            if tuple(weights[w.name].shape) != w.full_shape(shape):
                raise ValueError(f"Qwen3Decoder: weight {w.name} is {tuple(weights[w.name].shape)}, the shape "
                                 f"needs {w.full_shape(shape)}")
        self.table: dict[str, Tensor] = dict(weights)
        for name, t in self.table.items():
            if isinstance(t, nn.Parameter):
                self.register_parameter(name, t)
        self.embed = Embedding(family, WeightRef(self.table, "embed_tokens"))
        self.layers = nn.ModuleList(Qwen3Layer(shape, family, self.table, i) for i in range(shape.layers))
        self.norm = RMSNorm(family, WeightRef(self.table, "final_norm"), shape.eps)
        self.head = LinearLogp(family, WeightRef(self.table, "lm_head"))

    def forward(self, ids: Tensor, targets: Tensor, ctx: ChainContext) -> Tensor:
        h = self.embed(ids, ctx)
        for layer in self.layers:
            h = layer(h, ctx)
        h = ctx.cut(h)
        return ctx.finish_call(self.head(self.norm(h, ctx), targets, ctx))


# ------------------------------------------------------------------------------------------------ reference
def _rms(x: Tensor, w: Tensor, eps: float) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    ang = positions.to(x.dtype)[:, None] * inv[None, :]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None, :], torch.cat([ang, ang], -1).sin()[:, None, :]
    half = d // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _attention(q: Tensor, k: Tensor, v: Tensor, rows: RowIdentity) -> Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = torch.zeros_like(q)
    sample, position = rows.sample, rows.position
    for s in torch.unique(sample[sample >= 0]).tolist():
        idx = torch.nonzero(sample == s)[:, 0]
        idx = idx[torch.argsort(position[idx])].to(q.device)
        qs, ks, vs = (t[idx].transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.transpose(-1, -2) / math.sqrt(q.shape[-1])
        n = idx.numel()
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1)
        out = out.index_put((idx,), (probs @ vs).transpose(0, 1))
    return out


def reference_logp(w: Mapping[str, Tensor], ids: Tensor, targets: Tensor, rows: RowIdentity,
                   s: Qwen3Shape) -> Tensor:
    """The same chain in plain torch math in the weights' dtype (FP64 for the sweep's reference); every row
    of ``rows`` must be a real token and each sample's rows must start at position 0."""
    pos = rows.position.to(ids.device)
    x = w["embed_tokens"][ids]
    r = x.shape[0]
    for i in range(s.layers):
        hn = _rms(x, w["input_norm"][i], s.eps)
        q = _rms((hn @ w["q_proj"][i].T).view(r, s.heads, s.head_dim), w["q_norm"][i], s.eps)
        k = _rms((hn @ w["k_proj"][i].T).view(r, s.kv_heads, s.head_dim), w["k_norm"][i], s.eps)
        v = (hn @ w["v_proj"][i].T).view(r, s.kv_heads, s.head_dim)
        o = _attention(_rope(q, pos, s.rope_theta), _rope(k, pos, s.rope_theta), v, rows)
        x = x + o.reshape(r, -1) @ w["o_proj"][i].T
        hn = _rms(x, w["post_attn_norm"][i], s.eps)
        g = hn @ w["gate_proj"][i].T
        x = x + (g * torch.sigmoid(g) * (hn @ w["up_proj"][i].T)) @ w["down_proj"][i].T
    h = _rms(x, w["final_norm"], s.eps)
    return torch.log_softmax(h @ w["lm_head"].T, -1).gather(-1, targets[:, None])[:, 0]
