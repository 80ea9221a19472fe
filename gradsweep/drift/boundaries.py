"""The operator boundaries of the Qwen3 chain, and the forward hooks that read or replace a tensor at one.

A boundary is a tensor a trainer and an inference engine both compute: an op's output (embedding, each norm,
each projection, qk-norm, RoPE of q and of k, attention, SwiGLU, the residual stream, logp). Hooks sit on the
``gradsweep.nn`` modules of a ``Qwen3Decoder``, so the model code is the chain's own and every family (stock
torch, Triton, CUDA) exposes the same boundaries. Per call, a boundary's rows are restored to logical token
order (pads and fillers dropped) by the ``CallRows`` of that call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

# Per-layer boundaries in forward (execution) order: name, the op that produces it, and where to hook.
# ``where``: "out" = the module's output, "in" = the module's first input, "out2" = the second call of a module
# that runs twice per forward (RoPE: q first, then k).
LAYER_BOUNDARIES: tuple[tuple[str, str, str, str], ...] = (
    ("input_norm", "rms_norm", "input_norm", "out"),
    ("q_proj", "linear", "attn.q_proj", "out"),
    ("q_norm", "qk_norm", "attn.q_norm", "out"),
    ("k_proj", "linear", "attn.k_proj", "out"),
    ("k_norm", "qk_norm", "attn.k_norm", "out"),
    ("v_proj", "linear", "attn.v_proj", "out"),
    ("rope_q", "rope", "attn.rope", "out"),
    ("rope_k", "rope", "attn.rope", "out2"),
    ("attention", "attention", "attn.attention", "out"),
    ("o_proj", "linear", "attn.o_proj", "out"),
    ("attn_residual", "residual", "post_attn_norm", "in"),
    ("post_attn_norm", "rms_norm", "post_attn_norm", "out"),
    ("gate_proj", "linear", "mlp.gate", "out"),
    ("up_proj", "linear", "mlp.up", "out"),
    ("swiglu", "swiglu", "mlp.down", "in"),
    ("down_proj", "linear", "mlp.down", "out"),
    ("residual", "residual", "", "out"),
)
# Ops the chain needs from a kernel family (gradsweep.nn.kernels.MODULE_OF names); "residual" is an add.
CHAIN_OPS: tuple[str, ...] = ("embedding", "rms_norm", "linear", "qk_norm", "rope", "attention", "swiglu",
                              "linear_logp")


@dataclass(frozen=True)
class Boundary:
    """One boundary of a chain of ``layers`` layers; ``layer`` is None outside the layers."""

    name: str
    op: str
    layer: int | None
    module: str  # dotted path from the decoder
    where: str


def chain_boundaries(layers: int) -> list[Boundary]:
    """Every boundary of the chain, in forward order."""
    out = [Boundary("embedding", "embedding", None, "embed", "out")]
    for i in range(layers):
        for name, op, path, where in LAYER_BOUNDARIES:
            module = f"layers.{i}" + (f".{path}" if path else "")
            out.append(Boundary(f"L{i}.{name}", op, i, module, where))
    out.append(Boundary("final_norm", "rms_norm", None, "norm", "out"))
    out.append(Boundary("logp", "linear_logp", None, "head", "out"))
    return out


class CallRows:
    """Where one call's rows go in logical token order: ``dest[target] = out[source]`` (pads and fillers skipped)."""

    def __init__(self, logical_index: Tensor, device: torch.device) -> None:
        idx = logical_index.cpu()
        real = torch.nonzero(idx >= 0)[:, 0]
        self.all_real = bool(real.numel() == idx.numel())
        self.source = real.to(device)
        self.target = idx[real].to(device)

    def gather(self, out: Tensor) -> Tensor:
        return out if self.all_real else out.index_select(0, self.source)

    def scatter_into(self, dest: Tensor, out: Tensor) -> None:
        dest.index_copy_(0, self.target, self.gather(out).to(dest.dtype))

    def replaced(self, out: Tensor, logical: Tensor) -> Tensor:
        """``out`` with its real rows taken from ``logical`` (pads and fillers keep their own values)."""
        rows = logical.index_select(0, self.target).to(out.dtype).reshape(-1, *out.shape[1:])
        if self.all_real:
            return rows
        new = out.clone()
        new.index_copy_(0, self.source, rows)
        return new


class BoundaryHooks:
    """Forward hooks on a decoder: capture every boundary in logical order, and/or substitute one of them.

    ``capture``: logical tensors are allocated on first sight ([total tokens, *row shape], the output's dtype).
    ``substitute``: (boundary name, logical tensor) whose rows replace the boundary's rows in every call.
    Call ``begin_call(rows)`` before each call's forward.
    """

    def __init__(self, model: nn.Module, boundaries: list[Boundary], total: int, capture: bool,
                 substitute: tuple[str, Tensor] | None = None) -> None:
        self.total, self.capture = total, capture
        self.substitute = substitute
        self.tensors: dict[str, Tensor] = {}
        self.seen: dict[str, int] = {}
        self._rows: CallRows | None = None
        self._invocations: dict[int, int] = {}
        self._handles = []
        by_module: dict[str, list[Boundary]] = {}
        for b in boundaries:
            by_module.setdefault(b.module, []).append(b)
        for path, bs in by_module.items():
            module = model.get_submodule(path)
            outs = {b.where: b for b in bs if b.where in ("out", "out2")}
            ins = [b for b in bs if b.where == "in"]
            if outs:
                self._handles.append(module.register_forward_hook(self._out_hook(module, outs)))
            if ins:
                self._handles.append(module.register_forward_pre_hook(self._in_hook(ins[0])))

    def begin_call(self, rows: CallRows) -> None:
        self._rows = rows
        self._invocations.clear()

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _visit(self, name: str, t: Tensor) -> Tensor:
        rows = self._rows
        assert rows is not None, "begin_call before the forward"
        if self.substitute is not None and self.substitute[0] == name:
            t = rows.replaced(t, self.substitute[1])
        if self.capture:
            dest = self.tensors.get(name)
            if dest is None:
                dest = self.tensors[name] = torch.zeros((self.total, *t.shape[1:]), dtype=t.dtype, device=t.device)
            rows.scatter_into(dest, t.detach())
            self.seen[name] = self.seen.get(name, 0) + int(rows.target.numel())
        return t

    def _out_hook(self, module: nn.Module, outs: dict[str, Boundary]) -> Callable:
        def hook(mod, args, output):
            k = self._invocations.get(id(module), 0)
            self._invocations[id(module)] = k + 1
            b = outs.get("out" if k == 0 else "out2")
            if b is None:
                return None
            new = self._visit(b.name, output)
            return None if new is output else new
        return hook

    def _in_hook(self, b: Boundary) -> Callable:
        def hook(mod, args):
            new = self._visit(b.name, args[0])
            return None if new is args[0] else (new, *args[1:])
        return hook
