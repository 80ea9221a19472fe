"""The op registry: every op of the design, one module each, plus plugin modules (planted ops in tests)."""

from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module

from gradsweep.ops.base import OpSpec

BUILTIN_OPS: tuple[str, ...] = (
    "rms_norm", "qk_norm", "det_gemm", "attention", "embedding", "lm_head", "logp",
    "batch_invariant_logp", "linear_logp", "rope", "silu", "swiglu", "pack", "chain",
    "rl_ratio", "rl_kl", "rl_ppo", "rl_grpo", "rl_grpo_seq", "rl_dpo",
)
_REGISTRY: dict[str, OpSpec] = {}


def register(op: OpSpec) -> OpSpec:
    """Add an op (a plugin module calls this at import); a name is registered once."""
    existing = _REGISTRY.get(op.name)
    if existing is not None and existing is not op:
        raise ValueError(f"op {op.name!r} is already registered")
    _REGISTRY[op.name] = op
    return op


def _load_builtins() -> None:
    if len(_REGISTRY) >= len(BUILTIN_OPS) and all(n in _REGISTRY for n in BUILTIN_OPS):
        return
    for name in BUILTIN_OPS:
        register(import_module(f"gradsweep.ops.{name}").OP)


def load_plugins(modules: Iterable[str]) -> None:
    """Import plugin modules; each registers its ops with ``register``."""
    for mod in modules:
        try:
            import_module(mod)
        except ImportError as exc:
            raise ValueError(f"plugins: cannot import {mod!r} ({exc}); give an importable module path") from None


def op_names() -> list[str]:
    _load_builtins()
    return list(_REGISTRY)


def get_op(name: str) -> OpSpec:
    _load_builtins()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}; known: {', '.join(_REGISTRY)}") from None


def all_ops() -> dict[str, OpSpec]:
    _load_builtins()
    return dict(_REGISTRY)
