"""One training step of an op's candidate, called the way the sweep and a trainer call it.

The step goes through the op's declaration (``OpSpec``): the candidate's adapter calls the kernel's public
function with the call's row identities and fresh ``CanonicalFold`` objects over persistent FP32 main grads,
so what is timed includes the host planning, the uploads and the launches a training step pays. The inputs of
each call are gathered once, outside the timing (a trainer's inputs arrive as tensors); everything the step
creates per step (row identities, folds, attention caches) is created inside it.

A layout is a list of calls, each a list of pieces ``(sample, start, length)``; ``collect`` runs one step and
restores every output and gradient to logical token order, for the bitwise checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from gradsweep.bench.backward_mark import backward_section
from gradsweep.bench.data import OpData
from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.layouts import Call, Segment, as_padded
from gradsweep.ops.base import CallContext, Candidate, OpSpec, Shape

Piece = tuple[int, int, int]
Layout = list[list[Piece]]
MODES = ("fwd", "fwd_train", "fwd_bwd")


def packed_layout(lengths: Sequence[int]) -> Layout:
    """One call holding every sample, packed in sample order (the trainer's layout)."""
    return [[(s, 0, int(n)) for s, n in enumerate(lengths)]]


def rows_apart_layout(lengths: Sequence[int]) -> Layout | None:
    """The first token alone, then every other token as one batch (None: nothing to split)."""
    if sum(lengths) < 2:
        return None
    rest = [(s, 1 if s == 0 else 0, int(n) - (1 if s == 0 else 0)) for s, n in enumerate(lengths)]
    return [[(0, 0, 1)], [p for p in rest if p[2] > 0]]


def chunk_cut(n: int) -> int:
    """Where a sample of n tokens is cut: about 3/7 in, off every power-of-two tile boundary when n > 8."""
    cut = (3 * n) // 7 + (1 if n > 8 else 0)
    return min(max(cut, 1 if n > 1 else 0), n)


def chunked_layout(lengths: Sequence[int]) -> Layout | None:
    """Every sample cut in two calls (first parts, then the rest); None when no sample can be cut."""
    cuts = [chunk_cut(int(n)) for n in lengths]
    first = [(s, 0, c) for s, c in enumerate(cuts) if c > 0]
    second = [(s, c, int(n) - c) for s, (c, n) in enumerate(zip(cuts, lengths)) if n - c > 0]
    if not first or not second:
        return None
    return [first, second]


def make_call(pieces: Sequence[Piece], padded: bool) -> Call:
    """A packed call of the pieces (or, for an op whose input is a padded batch, the same as a padded call)."""
    segs, offset = [], 0
    for sample, start, length in pieces:
        segs.append(Segment(sample, start, length, offset))
        offset += length
    rows = RowIdentity.packed([p[2] for p in pieces], [p[0] for p in pieces], [p[1] for p in pieces])
    call = Call(rows, tuple(segs))
    return as_padded(call) if padded else call


def logical_index(rows: RowIdentity, offsets: np.ndarray) -> torch.Tensor:
    """Row -> logical token index (offset of its sample + position); -1 for a pad or filler row."""
    sample = rows.sample.numpy()
    real = sample >= 0
    idx = np.full(len(sample), -1, dtype=np.int64)
    idx[real] = offsets[sample[real]] + rows.position.numpy()[real]
    return torch.from_numpy(idx)


def gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` by logical index; a pad row (-1) is zeros. The whole table in order is the table
    itself (an alias: a vocabulary-wide input is not copied for the packed call)."""
    if index.numel() == table.shape[0] and bool((index == torch.arange(index.numel())).all()):
        return table.detach()
    index = index.to(table.device)
    real = index >= 0
    if bool(real.all()):
        return table.index_select(0, index)
    out = torch.zeros((index.numel(), *table.shape[1:]), dtype=table.dtype, device=table.device)
    out[real] = table.index_select(0, index[real])
    return out


@dataclass
class _CallData:
    pieces: list[Piece]
    index: torch.Tensor
    inputs: dict[str, torch.Tensor]


class OpStep:
    """A callable step of one candidate over one layout of one copy of the data.

    ``mode``: ``fwd`` (no_grad forward), ``fwd_train`` (forward recording the graph, no backward) or
    ``fwd_bwd`` (forward of every call, then the backwards in reverse call order, folds finished).
    ``grads``: which leaves require grad in the training modes (``all``, ``inputs`` or ``params``).
    """

    def __init__(self, op: OpSpec, candidate: Candidate, data: OpData, shape: Shape, lengths: Sequence[int],
                 layout: Layout, mode: str, grads: str = "all") -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: use one of {', '.join(MODES)}")
        self.op, self.candidate, self.data, self.shape = op, candidate, data, dict(shape)
        self.lengths = tuple(int(n) for n in lengths)
        self.mode, self.grads = mode, grads
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        train = mode != "fwd"
        want_inputs = train and grads in ("all", "inputs")
        want_params = train and grads in ("all", "params")
        self.params = {n: t.detach().requires_grad_(want_params) for n, t in data.params.items()}
        self.calls: list[_CallData] = []
        for pieces in layout:
            call = make_call(pieces, op.padded_input)
            index = logical_index(call.rows, self.offsets)
            inputs = {}
            for spec in op.inputs:
                t = gather(data.inputs[spec.name], index)
                inputs[spec.name] = t.requires_grad_(bool(want_inputs and spec.grad))
            self.calls.append(_CallData(list(pieces), index, inputs))
        self.fold_params = want_params and candidate.param_grads == "fold"
        self._upstream: dict[int, list[torch.Tensor]] = {}
        self.last: dict | None = None

    def _fresh_folds(self) -> dict[str, CanonicalFold]:
        if not self.fold_params:
            return {}
        tiles = self.candidate.fold_tiles()
        return {n: CanonicalFold(self.data.main_grads[n], self.lengths, tiles[n]) for n in self.params}

    def _upstream_for(self, k: int, out_rows: RowIdentity) -> list[torch.Tensor]:
        if k not in self._upstream:
            index = logical_index(out_rows, self.offsets)
            self._upstream[k] = [gather(self.data.upstream[o.name], index) for o in self.op.outputs]
        return self._upstream[k]

    def __call__(self) -> None:
        """One step (what is timed); nothing of it is kept, so a step never holds the previous one's graph."""
        self._step(keep=False)

    def _step(self, keep: bool) -> None:
        for p in self.params.values():
            p.grad = None
        for c in self.calls:
            for t in c.inputs.values():
                t.grad = None
        folds = self._fresh_folds()
        state: dict = {}
        results = []
        with torch.set_grad_enabled(self.mode != "fwd"):
            for c in self.calls:
                call = make_call(c.pieces, self.op.padded_input)
                ctx = CallContext(call, c.inputs, self.params, folds, state, self.shape, self.lengths)
                out = self.candidate.run(ctx)
                results.append((call, out))
        if self.mode == "fwd_bwd":
            with backward_section():  # the backward and the folds' finish, marked in profiled rounds
                for k in reversed(range(len(results))):
                    call, out = results[k]
                    tensors = [out.tensors[o.name] for o in self.op.outputs]
                    # several calls: a later call's graph can reach an earlier one's (keys through a cache), as in
                    # the harness; the graph is freed with the step either way
                    torch.autograd.backward(tensors, self._upstream_for(k, out.rows or call.rows),
                                            retain_graph=len(results) > 1)
                folded = self.candidate.folded_input_grads(state) if self.candidate.folded_input_grads else {}
                for fold in folds.values():
                    fold.finish()
        else:
            folded = {}
        self.last = {"results": results, "folds": folds, "folded": folded} if keep else None

    def collect(self) -> dict[str, torch.Tensor]:
        """Zero the main grads, run one step, return outputs and gradients in logical token order."""
        self.zero_main_grads()
        last = self.record()
        self.last = None
        return self.gathered(last)

    def zero_main_grads(self) -> None:
        for g in self.data.main_grads.values():
            g.zero_()

    def record(self) -> dict:
        """One step whose results are kept (outputs, folds, folded input grads): what ``gathered`` reads. Device
        work only after the call's host planning (no read-back), so a CUDA graph can capture it."""
        self._step(keep=True)
        assert self.last is not None
        return self.last

    def gathered(self, last: dict) -> dict[str, torch.Tensor]:
        """Outputs and gradients of a recorded step, in logical token order (copies)."""
        total = int(sum(self.lengths))
        got: dict[str, torch.Tensor] = {}
        for call, out in last["results"]:
            index = logical_index(out.rows or call.rows, self.offsets)
            for spec in self.op.outputs:
                _restore(got, spec.name, out.tensors[spec.name], index, total)
        if self.mode != "fwd_bwd":
            return got
        folded = last["folded"]
        for name, t in folded.items():
            got[name] = t.detach().clone()
        for c in self.calls:
            for spec in self.op.inputs:
                if spec.grad and spec.grad not in folded and c.inputs[spec.name].grad is not None:
                    _restore(got, spec.grad, c.inputs[spec.name].grad, c.index, total)
        for spec in self.op.params:
            if spec.name in last["folds"]:
                got[spec.grad] = self.data.main_grads[spec.name].clone()
            elif self.params[spec.name].grad is not None:
                got[spec.grad] = self.params[spec.name].grad.detach().clone()
        return got


def _restore(got: dict[str, torch.Tensor], name: str, physical: torch.Tensor, index: torch.Tensor,
             total: int) -> None:
    """Scatter a call's rows into the logical tensor ``got[name]`` (pads dropped)."""
    physical = physical.detach()
    if name not in got:
        got[name] = torch.zeros((total, *physical.shape[1:]), dtype=physical.dtype, device=physical.device)
    real = torch.nonzero(index >= 0)[:, 0]
    got[name][index[real].to(physical.device)] = physical[real.to(physical.device)]
