"""The step context: what every gradsweep.nn module reads besides its weights and activations.

A model is written the ordinary way, ``logp = model(ids, targets, ctx)``; the context carries what a
batch-invariant kernel needs and an ordinary module never sees:

- the **row identities** of the current call (``RowIdentity``: sample id and position of every physical
  row; pads and fillers have sample < 0), and their positions on the device (RoPE, attention);
- the **folds**: one ``CanonicalFold`` per parameter (its FP32 main grad, which the kernels fold into in
  canonical order). A per-layer parameter is stored stacked ``[layers, ...]``; each layer gets its own fold
  over a view of the stacked main grad, and the stacked fold itself is a *ledger* that completes exactly
  when every layer's fold has folded every token of the step (so ``finish()`` still proves completeness);
- the **attention caches** (one per layer: the logical K/V store and the dK/dV fold), which outlive a call;
- the **stash** of the kernels' own autograd graphs between a custom op's forward and backward
  (``gradsweep.nn.ops``), keyed by a token tensor, so the compiled graph only ever carries tensors.

Two backward modes (see ``layerwise.py``): **ordinary** when one call holds every token of the step (plain
autograd, ``torch.compile``-able), **layerwise** otherwise (chunked prefill, one call per sample, decode...):
attention's dK/dV are final only after every call's attention backward of that layer, so the step's backward
runs layer by layer across its calls once every call's upstream gradient has arrived.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from gradsweep.canonical import CanonicalFold, RowIdentity, device_positions

Mode = Literal["auto", "ordinary", "layerwise"]

_IDS = itertools.count(1)
_CONTEXTS: weakref.WeakValueDictionary[int, ChainContext] = weakref.WeakValueDictionary()
NO_TOKEN = -1  # token of a forward that stashed nothing (no gradient needed)


def context_of(ctx_id: int) -> ChainContext:
    """The live context with this id (custom ops receive the id: a compiled graph carries no Python objects)."""
    try:
        return _CONTEXTS[ctx_id]
    except KeyError:
        raise RuntimeError(f"gradsweep.nn: context {ctx_id} no longer exists; keep the ChainContext alive until "
                           "the step's backward has run") from None


@dataclass
class _LayeredFold:
    """One fold per layer over views of a stacked main grad; the stacked fold is the step's completeness ledger."""

    parent: CanonicalFold
    layers: list[CanonicalFold]

    def settle(self) -> None:
        if not self.parent.done and all(f.done for f in self.layers):
            self.parent.take(RowIdentity.packed(self.parent.lengths.tolist()), ())


@dataclass
class Stashed:
    """A kernel call's own autograd graph, kept from a custom op's forward to its backward."""

    outputs: tuple[torch.Tensor, ...]
    leaves: tuple[torch.Tensor, ...]
    param: str | None = None
    payload: Any = None


@dataclass
class CallRecord:
    """Layerwise mode: one call's cut points (in forward order), its output and its upstream gradient."""

    rows: RowIdentity
    cuts: list[Any] = field(default_factory=list)
    output: torch.Tensor | None = None
    grad: torch.Tensor | None = None


class ChainContext:
    """State of one step (one optimiser step's worth of tokens), shared by every call of that step.

    ``lengths``: every logical sample of the step (ids 0..N-1). ``folds``: parameter name -> CanonicalFold
    (None or empty: no parameter gradients, e.g. inference or the stock flavour). ``layered``: names of the
    per-layer parameters stored stacked ``[layers, ...]``.
    """

    def __init__(self, lengths: Sequence[int], device: torch.device | str,
                 folds: Mapping[str, CanonicalFold] | None = None, layered: Sequence[str] = (), layers: int = 0,
                 mode: Mode = "auto") -> None:
        if mode not in ("auto", "ordinary", "layerwise"):
            raise ValueError(f"ChainContext: mode {mode!r}; use 'auto', 'ordinary' or 'layerwise'")
        self.id = next(_IDS)
        _CONTEXTS[self.id] = self
        self.lengths = tuple(int(n) for n in lengths)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)])[:-1].astype(np.int64)
        self.total = int(sum(self.lengths))
        self.device = torch.device(device)
        self.requested_mode: Mode = mode
        self.mode: Mode | None = None if mode == "auto" else mode
        self.folds = dict(folds or {})
        self._layered: dict[str, _LayeredFold] = {}
        for name in layered:
            parent = self.folds.get(name)
            if parent is None:
                continue
            if parent.main_grad.dim() < 1 or parent.main_grad.shape[0] != layers:
                raise ValueError(f"ChainContext: the main grad of {name} is {tuple(parent.main_grad.shape)}; "
                                 f"a per-layer parameter is stacked [layers={layers}, ...]")
            subs = [CanonicalFold(parent.main_grad[i], self.lengths, parent.tile) for i in range(layers)]
            self._layered[name] = _LayeredFold(parent, subs)
        self.caches: dict[int, Any] = {}
        self.state: dict[str, Any] = {}
        self._stash: dict[int, Stashed] = {}
        self._stash_ids = itertools.count(1)
        self.rows: RowIdentity | None = None
        self.positions: torch.Tensor | None = None
        self.calls: list[CallRecord] = []
        self._seen_tokens = 0
        self.backward_done = False

    # ------------------------------------------------------------------------------------------------ calls
    def begin_call(self, rows: RowIdentity) -> None:
        """Make ``rows`` the current call's row identities (every module of this call reads them)."""
        real = int((rows.sample >= 0).sum())
        if self.mode is None:
            self.mode = "ordinary" if real == self.total else "layerwise"
        elif self.mode == "ordinary" and self._seen_tokens and self.requested_mode == "auto":
            raise RuntimeError("ChainContext: the step's first call held every token, so it ran in ordinary mode; "
                               "a further call cannot join it (use a new context per step)")
        self._seen_tokens += real
        if self._seen_tokens > self.total:
            raise RuntimeError(f"ChainContext: {self._seen_tokens} tokens forwarded for a step of {self.total}; "
                               "a token was forwarded twice or the lengths are wrong")
        self.rows = rows
        self.positions = device_positions(rows, self.device)
        if self.mode == "layerwise":
            self.calls.append(CallRecord(rows))

    @property
    def layerwise(self) -> bool:
        return self.mode == "layerwise"

    @property
    def recording(self) -> bool:
        """Layerwise mode with gradients on: modules cut the graph at layer boundaries and attention."""
        return self.layerwise and torch.is_grad_enabled()

    @property
    def current(self) -> CallRecord:
        return self.calls[-1]

    @property
    def all_forwarded(self) -> bool:
        return self._seen_tokens == self.total

    # ------------------------------------------------------------------------------------------------ folds
    def fold(self, name: str, layer: int | None = None) -> CanonicalFold | None:
        """The fold a kernel uses for parameter ``name`` (of ``layer`` when the parameter is per-layer)."""
        if layer is not None and name in self._layered:
            return self._layered[name].layers[layer]
        if layer is not None and name in self.folds:
            raise ValueError(f"ChainContext: {name} was not declared per-layer (layered=...)")
        return self.folds.get(name)

    def main_grad(self, name: str, layer: int | None = None) -> torch.Tensor | None:
        fold = self.fold(name, layer)
        return None if fold is None else fold.main_grad

    def settle(self, name: str | None) -> None:
        """After a kernel folded into ``name``: complete the stacked ledger once every layer's fold is done."""
        if name is not None and name in self._layered:
            self._layered[name].settle()

    def attention_cache(self, layer: int, make: Callable[[], Any]) -> Any:
        if layer not in self.caches:
            self.caches[layer] = make()
        return self.caches[layer]

    # ------------------------------------------------------------------------------------------------ stash
    def stash(self, entry: Stashed) -> torch.Tensor:
        key = next(self._stash_ids)
        self._stash[key] = entry
        return torch.tensor([key], dtype=torch.int64)

    def unstash(self, token: torch.Tensor) -> Stashed:
        key = int(token.reshape(-1)[0])
        try:
            return self._stash.pop(key)
        except KeyError:
            raise RuntimeError(f"gradsweep.nn: stashed forward {key} is gone (a backward ran twice, or the forward "
                               "ran without gradients)") from None

    @property
    def stashed(self) -> int:
        """Forwards still waiting for their backward."""
        return len(self._stash)

    # ------------------------------------------------------------------------------------------------ cuts
    def cut(self, h: torch.Tensor) -> torch.Tensor:
        """A layer boundary: identity in ordinary mode; in layerwise mode a fresh leaf whose gradient the
        layerwise backward hands to ``h`` once every later segment of this call has run."""
        if not self.recording:
            return h
        from gradsweep.nn.layerwise import BoundaryCut

        leaf = h.detach().requires_grad_(True)
        self.current.cuts.append(BoundaryCut(h, leaf))
        return leaf

    def finish_call(self, logp: torch.Tensor) -> torch.Tensor:
        """The call's output: itself in ordinary mode; in layerwise mode a node that stashes its upstream
        gradient and runs the whole step's backward when the last one arrives."""
        if not self.recording:
            return logp
        from gradsweep.nn.layerwise import attach_output

        return attach_output(self, logp)
