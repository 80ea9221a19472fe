"""A Hugging Face Qwen3 checkpoint onto the chain: shape from its config, weights from its state dict.

The chain's per-layer weights are stacked ``[layers, ...]`` (``qwen3.WEIGHTS``); ``model.layers.{i}.<x>.weight``
becomes slice ``i`` of the chain weight. Only plain Qwen3 decoders map exactly: no attention bias, no sliding
window, default RoPE; anything else is refused with the field to change. A checkpoint with tied embeddings
(no ``lm_head.weight``) gets a copy of the embedding as ``lm_head``: the chain then reports the two uses'
gradients separately (their sum is the tied weight's gradient).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gradsweep.nn.qwen3 import WEIGHTS, Qwen3Shape, WeightSpec


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def shape_from_config(config: Any) -> Qwen3Shape:
    """The chain's shape from a transformers ``Qwen3Config`` (or the dict of its config.json)."""
    if _get(config, "attention_bias", False):
        raise ValueError("Qwen3 config: attention_bias is true; the chain's projections have no bias")
    if _get(config, "use_sliding_window", False):
        raise ValueError("Qwen3 config: use_sliding_window is true; the chain attends to every earlier token")
    rope = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, Mapping) else "default"
    if rope_type != "default":
        raise ValueError(f"Qwen3 config: rope_type {rope_type!r}; the chain implements default RoPE only")
    theta = rope.get("rope_theta") if isinstance(rope, Mapping) else None
    theta = theta if theta is not None else _get(config, "rope_theta", 10000.0)
    heads = int(_get(config, "num_attention_heads"))
    hidden = int(_get(config, "hidden_size"))
    return Qwen3Shape(hidden=hidden, heads=heads, kv_heads=int(_get(config, "num_key_value_heads", heads)),
                      head_dim=int(_get(config, "head_dim", None) or hidden // heads),
                      intermediate=int(_get(config, "intermediate_size")), vocab=int(_get(config, "vocab_size")),
                      layers=int(_get(config, "num_hidden_layers")), eps=float(_get(config, "rms_norm_eps", 1e-6)),
                      rope_theta=float(theta))


def read_state_dict(source: Mapping[str, Tensor] | str | Path) -> dict[str, Tensor]:
    """A state dict as given, or read from a .safetensors file or a directory of them (sharded checkpoints)."""
    if isinstance(source, Mapping):
        return dict(source)
    from safetensors.torch import load_file

    path = Path(source)
    if path.is_file():
        return load_file(str(path))
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint at {path}; give a .safetensors file or a directory holding them")
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else \
        sorted(p.name for p in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path} holds no .safetensors file")
    out: dict[str, Tensor] = {}
    for name in files:
        out.update(load_file(str(path / name)))
    return out


def hf_name(spec: WeightSpec, layer: int | None = None) -> str:
    return spec.hf.format(layer) if spec.per_layer else spec.hf


def chain_weights(source: Mapping[str, Tensor] | str | Path, shape: Qwen3Shape, dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """Every chain weight (per-layer ones stacked) from a Qwen3 state dict, cast to ``dtype`` on ``device``."""
    state = read_state_dict(source)
    used: set[str] = set()
    out: dict[str, Tensor] = {}
    for spec in WEIGHTS:
        names = [hf_name(spec, i) for i in range(shape.layers)] if spec.per_layer else [hf_name(spec)]
        if spec.name == "lm_head" and names[0] not in state:
            names = [hf_name(next(w for w in WEIGHTS if w.name == "embed_tokens"))]  # tied embeddings
        absent = [n for n in names if n not in state]
        if absent:
            raise ValueError(f"checkpoint: no tensor {absent[0]!r}; is it a Qwen3 decoder of {shape.layers} layers?")
        parts = [state[n] for n in names]
        used.update(names)
        t = torch.stack(parts) if spec.per_layer else parts[0]
        want = spec.full_shape(shape)
        if tuple(t.shape) != want:
            raise ValueError(f"checkpoint: {names[0]} gives {spec.name} {tuple(t.shape)}, the config needs {want}")
        out[spec.name] = t.detach().to(device=device, dtype=dtype).contiguous()
    extra = sorted(set(state) - used - {"model.rotary_emb.inv_freq"})
    if extra:
        raise ValueError(f"checkpoint: {len(extra)} tensors the chain has no place for (first: {extra[0]!r}); "
                         "the chain maps a plain Qwen3 decoder only")
    return out


def hf_gradients(grads: Mapping[str, Tensor], shape: Qwen3Shape) -> dict[str, Tensor]:
    """The chain's weight gradients under the Hugging Face parameter names (stacked ones split per layer)."""
    out = {}
    for spec in WEIGHTS:
        g = grads[spec.name]
        if spec.per_layer:
            for i in range(shape.layers):
                out[hf_name(spec, i)] = g[i]
        else:
            out[hf_name(spec)] = g
    return out
