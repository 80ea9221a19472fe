"""Run one candidate over one layout's calls and restore every result to logical identity.

The harness owns the inputs (from logical identity), the upstream gradients, the loss mask, the
starting main grads and the order of the calls' backwards; the candidate only sees physical rows.
Calls are made as a model makes them: every forward first, then the backwards in reverse call order
(``schedule="reverse"``), or each backward right after its forward (``"interleaved"``, gradient
accumulation over micro-batches). Input gradients are read only after every backward ran, because a
later call may still add to an earlier call's input (attention keys through the KV cache).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.harness.compare import bitwise_compare
from gradsweep.layouts import Call, as_padded, offset_copy, strided_copy
from gradsweep.ops.base import CallContext, Candidate, OpSpec, Shape
from gradsweep.workload import Workload


class MissingBackward(Exception):
    """A candidate produced no gradient path for a named tensor (status red_no_backward)."""

    def __init__(self, tensor: str, detail: str) -> None:
        super().__init__(f"no gradient for {tensor}: {detail}")
        self.tensor = tensor


class AdapterError(Exception):
    """A candidate's outputs do not cover the logical tokens exactly once (wrong rows, shapes or dtypes)."""


class SideEffect(AdapterError):
    """A candidate wrote memory it does not own: a call's input, a parameter, an upstream gradient, or a forward
    output it had already handed back (red_verdict). Invariance and accuracy read only what a call returns, so a
    kernel that uses its input as scratch, a backward that scales its upstream gradient in place, a kernel that
    updates its weight, or a forward that returns one workspace for every call computes right values and would be
    green; a trainer reading that memory afterwards (the residual stream, the next layer's gradient, the next
    micro-batch's weight, an earlier micro-batch's logits) gets other values."""


@dataclass
class LayoutRun:
    """Logical results of one candidate over one layout: name -> tensor, plus how it was called."""

    tensors: dict[str, torch.Tensor]
    kinds: dict[str, str]
    call_rows: list[int] = field(default_factory=list)
    padded_calls: int = 0
    schedule: str = "reverse"


_PARAMS: dict[tuple, dict[str, torch.Tensor]] = {}


def _drawn_params(op: OpSpec, shape: Shape, workload: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    """The drawn parameters themselves (never handed to a candidate: ``make_params`` clones them)."""
    key = (op.name, tuple(sorted(shape.items())), workload.seed, str(device))
    if key not in _PARAMS:
        if len(_PARAMS) >= 4:
            _PARAMS.clear()
        _PARAMS[key] = {p.name: (workload.params(p.name, p.shape(shape), p.scale(shape), torch.float32, "cpu")
                                 + p.offset).to(torch.bfloat16).to(device)
                        for p in op.params}
    return _PARAMS[key]


def make_params(op: OpSpec, shape: Shape, workload: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    """Parameters from (seed, name), bf16 on the device (fresh tensors each call).

    Drawing a 151936 x 4096 table takes seconds on the host, so a worker draws each one once.
    """
    return {name: t.clone() for name, t in _drawn_params(op, shape, workload, device).items()}


_LOGICAL: dict[tuple, tuple[dict[str, torch.Tensor], list[torch.Tensor]]] = {}


def forget_drawn() -> None:
    """Drop the drawn parameter and logical-token tables (a worker moving to the next op gives their memory back)."""
    _PARAMS.clear()
    _LOGICAL.clear()


def _logical_data(op: OpSpec, shape: Shape, workload: Workload, device: torch.device
                  ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Every logical token's inputs (bf16 / ids) and upstream gradients (declared dtype), drawn once.

    A value is a pure function of (seed, sample, position), so a call's real rows are gathered from these
    tables instead of re-hashing them: a decode layout makes thousands of calls of a few rows each.
    """
    key = (op.name, tuple(sorted(shape.items())), workload, str(device))
    if key not in _LOGICAL:
        if len(_LOGICAL) >= 2:
            _LOGICAL.clear()
        rows = workload.logical_rows()
        inputs = {spec.name: _draw_input(spec, shape, workload, rows, device) for spec in op.inputs}
        ups = [_draw_upstream(spec, shape, workload, rows, device) for spec in op.outputs]
        _LOGICAL[key] = (inputs, ups)
    return _LOGICAL[key]


def _draw_input(spec, shape: Shape, workload: Workload, rows: RowIdentity, device: torch.device) -> torch.Tensor:
    if spec.is_index:
        return workload.indices(f"in:{spec.name}", rows, spec.index_high(shape), device)
    return workload.values(f"in:{spec.name}", rows, spec.feature(shape), spec.scale, device, torch.bfloat16)


def _draw_upstream(spec, shape: Shape, workload: Workload, rows: RowIdentity, device: torch.device) -> torch.Tensor:
    if spec.upstream == "drawn":
        return workload.upstream(spec.name, rows, spec.feature(shape), device, spec.dtype)
    # a per-token loss term: its upstream is the harness's loss reduction itself
    return workload.loss_upstream(spec.name, rows, spec.upstream, device, spec.dtype)


def _gather(table: torch.Tensor, rows: RowIdentity, workload: Workload, draw_others) -> torch.Tensor:
    """Rows of a call: real rows from the logical table, pads and fillers drawn for this call (hostile)."""
    idx = workload.logical_index(rows)
    real = idx >= 0
    if bool(real.all()):
        return table.index_select(0, idx.to(table.device))
    out = torch.empty((rows.num_rows, *table.shape[1:]), dtype=table.dtype, device=table.device)
    pos = torch.nonzero(real)[:, 0]
    out[pos.to(table.device)] = table.index_select(0, idx[pos].to(table.device))
    others = torch.nonzero(~real)[:, 0]
    out[others.to(table.device)] = draw_others(RowIdentity(rows.sample[others], rows.position[others]))
    return out


def make_inputs(op: OpSpec, shape: Shape, workload: Workload, rows: RowIdentity, device: torch.device,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Per-row inputs from logical identity, rounded to bf16 (then upcast to ``dtype`` for baselines).

    Every run of a cell, candidate, stock or reference, consumes the same bf16 values; pads hold
    NaN / inf (workload.values).
    """
    tables, _ = _logical_data(op, shape, workload, device)
    out = {}
    for spec in op.inputs:
        v = _gather(tables[spec.name], rows, workload,
                    lambda r, spec=spec: _draw_input(spec, shape, workload, r, device))
        out[spec.name] = v if spec.is_index or dtype == torch.bfloat16 else v.to(dtype)
    return out


def make_upstream(op: OpSpec, shape: Shape, workload: Workload, rows: RowIdentity, device: torch.device,
                  dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """Upstream gradients of every output, drawn in the output's declared dtype, then upcast to ``dtype``."""
    _, tables = _logical_data(op, shape, workload, device)
    grads = []
    for spec, table in zip(op.outputs, tables):
        g = _gather(table, rows, workload,
                    lambda r, spec=spec: _draw_upstream(spec, shape, workload, r, device))
        grads.append(g if dtype is None or dtype == spec.dtype else g.to(dtype))
    return grads


def main_grad_starts(op: OpSpec, shape: Shape, workload: Workload, scales: dict[str, float],
                     device: torch.device) -> dict[str, torch.Tensor]:
    """The FP32 main grad each parameter holds before the step (gradient accumulation), by parameter name."""
    return {p.name: workload.main_grad_start(p.name, p.shape(shape), scales.get(p.grad, 1.0), device)
            for p in op.params}


def _restore(workload: Workload, rows: RowIdentity, physical: torch.Tensor, dest: torch.Tensor,
             filled: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy the real rows of ``physical`` to their logical rows of ``dest``; return (their physical rows, their
    logical rows)."""
    if physical.shape[0] != rows.num_rows:
        raise AdapterError(f"{name}: {physical.shape[0]} rows returned for {rows.num_rows} physical rows")
    if tuple(physical.shape[1:]) != tuple(dest.shape[1:]):
        raise AdapterError(f"{name}: row shape {tuple(physical.shape[1:])}, expected {tuple(dest.shape[1:])}")
    idx = workload.logical_index(rows)
    real = torch.nonzero(idx >= 0)[:, 0]
    target = idx[real]
    if filled[target].any():
        raise AdapterError(f"{name}: a logical token was produced twice")
    filled[target] = True
    dest[target.to(dest.device)] = physical[real.to(physical.device)].detach().to(dest.dtype)
    return real, target


@contextmanager
def exact_fp32():
    """FP32 math without TF32 (the FP32-accumulating stock baseline must not round operands to 10 bits)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _Guard:
    """What the harness handed a candidate, with its bits at hand-over: checked unchanged after the run
    (``SideEffect``). Inputs and upstream gradients are snapshots (per-token tensors: small), parameters are
    compared with the drawn originals (no copy of a vocabulary table), and each call's forward outputs are
    compared, once every forward ran, with the logical copy the harness took when the call returned."""

    def __init__(self, n_calls: int) -> None:
        self.n_calls = n_calls
        self.kept: list[tuple[str, torch.Tensor, torch.Tensor]] = []
        self.handed: list[tuple[int, str, torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def keep(self, i: int, what: str, t: torch.Tensor) -> None:
        self.kept.append((f"call {i + 1} of {self.n_calls}: {what}", t, t.detach().clone()))

    def hand(self, i: int, name: str, t: torch.Tensor, real: torch.Tensor, target: torch.Tensor) -> None:
        """Call ``i`` returned ``t`` as output ``name``; ``_restore`` copied its rows ``real`` to logical ``target``."""
        self.handed.append((i, name, t, real, target))

    def check_outputs(self, logical: dict[str, torch.Tensor]) -> None:
        for i, name, t, real, target in self.handed:
            now = t.detach()[real.to(t.device)].to(logical[name].dtype)
            d = bitwise_compare(now, logical[name][target.to(logical[name].device)])
            if not d.equal:
                raise SideEffect(f"side effect: call {i + 1} of {self.n_calls}'s output {name} changed after the call "
                                 f"returned it ({d.mismatched} elements; written by a later call): every call must "
                                 "return memory of its own, not a workspace that the next call reuses")

    def check_handed(self, params: dict[str, torch.Tensor], drawn: dict[str, torch.Tensor]) -> None:
        for what, t, was in self.kept:
            _unchanged(what, t, was)
        for name, p in params.items():
            _unchanged(f"parameter {name}", p, drawn[name].to(p.dtype))


def _unchanged(what: str, now: torch.Tensor, was: torch.Tensor) -> None:
    d = bitwise_compare(now.detach(), was)
    if not d.equal:
        raise SideEffect(f"side effect: {what} was written by the candidate ({d.mismatched} of {now.numel()} "
                         "elements changed): a kernel must leave what it is handed unchanged and write into "
                         "buffers of its own")


class Arena:
    """Buffers kept between runs (``run_layout(arena=...)``): each input, upstream gradient, parameter and starting
    main grad of a run is copied into the buffer its key had in the last run through the same arena, so a second
    run hands the candidate the very addresses of the first, with other values where the first was a decoy run.

    Why: a kernel that keys something derived from a tensor's contents (its output, a transposed or quantised copy
    of a weight, a plan) on the tensor's address alone is right in every fresh run and wrong whenever memory is
    reused: a trainer's optimizer updates the weights in place every step, an engine refills the same batch
    buffers. Fresh runs cannot see that defect; the reference layout's last rerun, in the buffers of a run on other
    values, does (judge.py)."""

    def __init__(self) -> None:
        self._bufs: dict[tuple, torch.Tensor] = {}

    def place(self, key: tuple, t: torch.Tensor, decoy: bool) -> torch.Tensor:
        """``t``'s values (``decoy_values(t)`` for a decoy run) in ``key``'s buffer, as a fresh autograd leaf."""
        buf = self._bufs.get(key)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.device != t.device:
            buf = self._bufs[key] = _unshared_address(t)
        buf.copy_(decoy_values(t) if decoy else t)
        return buf.detach()


_SHIFTS = itertools.count()


def _unshared_address(t: torch.Tensor) -> torch.Tensor:
    """An empty contiguous tensor like ``t`` whose address is 48 + 64 k bytes past a 512-byte boundary.

    Fresh tensors start on 64-byte (host) or 512-byte (CUDA) boundaries and bn_strided's views 8 elements (8-64
    bytes) past one, so no tensor of an ordinary run ever had this address: a cache entry the kernel made there
    can only come from the decoy run (or from an earlier arena at the same block and shift, 1 in 8), and the
    rerun cannot be handed back the reference run's own results by an address that memory reuse happened to
    repeat. 16-byte aligned, as TMA and vector loads need (bn_strided already holds every kernel to that)."""
    shift = 48 + 64 * (next(_SHIFTS) % 8)
    nbytes = t.numel() * t.element_size()
    raw = torch.empty(nbytes + 1024, dtype=torch.uint8, device=t.device)
    start = (-raw.data_ptr()) % 512 + shift
    return raw[start:start + nbytes].view(t.dtype).view(t.shape)


def decoy_values(t: torch.Tensor) -> torch.Tensor:
    """Other values of the same shape and dtype, each one still a value the tensor could hold (ids stay ids in
    range): the elements in reverse order along every dimension."""
    return t.flip(tuple(range(t.dim()))) if t.dim() else t.clone()


@dataclass
class _Pending:
    """One call's forward results, waiting for its backward."""

    rows: RowIdentity
    inputs: dict[str, torch.Tensor]
    outs: list[torch.Tensor]
    grads: list[torch.Tensor]


def run_layout(op: OpSpec, candidate: Candidate, shape: Shape, workload: Workload, calls: Sequence[Call],
               device: torch.device, backward: bool = True, schedule: str = "reverse",
               main_grads: dict[str, torch.Tensor] | None = None,
               compute_dtype: torch.dtype = torch.bfloat16, arena: Arena | None = None,
               decoy: bool = False) -> LayoutRun:
    """Run every call (forward, then backward by ``schedule``) and restore results to logical order.

    ``main_grads``: the FP32 main grad each parameter starts from (zeros when None). A folding candidate
    gets it as its accumulator; an autograd candidate's gradient is added to it in FP32, as a trainer's
    gradient accumulation does. ``compute_dtype`` float32 runs a stock baseline on the same bf16 values.
    ``arena``: every tensor handed to the candidate lives in the arena's buffers (``Arena``); ``decoy`` fills them
    with ``decoy_values`` instead (a run whose results only matter for what it leaves behind).
    """
    if schedule not in ("reverse", "interleaved"):
        raise ValueError(f"unknown schedule {schedule!r}; use 'reverse' or 'interleaved'")
    if decoy and arena is None:
        raise ValueError("run_layout: a decoy run needs an arena (it only matters for the buffers it leaves)")
    total = workload.num_tokens
    flat = offset_copy if any(c.strided for c in calls) else (lambda t: t)  # bn_strided: flat-buffer views

    def place(key: tuple, t: torch.Tensor) -> torch.Tensor:
        return t if arena is None else arena.place(key, t, decoy)

    drawn = _drawn_params(op, shape, workload, device)  # (an arena copies them: no clone first, as make_params')
    params = {n: flat(place(("param", n), t.to(compute_dtype))).requires_grad_(backward)
              for n, t in (make_params(op, shape, workload, device) if arena is None else drawn).items()}
    starts = {n: flat(place(("start", n), main_grads[n].clone() if main_grads is not None and n in main_grads
                            else torch.zeros(t.shape, dtype=torch.float32, device=device)))
              for n, t in params.items()}
    folds: dict[str, CanonicalFold] = {}
    if candidate.param_grads == "fold" and backward:
        tiles = candidate.fold_tiles()
        folds = {n: CanonicalFold(starts[n], workload.lengths, tiles[n]) for n in params}
    state: dict = {}
    logical: dict[str, torch.Tensor] = {}
    filled: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    pending: list[_Pending] = []
    run = LayoutRun({}, kinds, schedule=schedule)
    guard = _Guard(len(calls))

    def dest(name: str, kind: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if name not in logical:
            logical[name] = torch.zeros((total, *like.shape[1:]), dtype=like.dtype, device=like.device)
            filled[name] = torch.zeros(total, dtype=torch.bool)
            kinds[name] = kind
        return logical[name], filled[name]

    for i, call in enumerate(calls):
        call = as_padded(call) if op.padded_input else call
        run.call_rows.append(call.num_rows)
        run.padded_calls += call.padded is not None
        inputs = {name: place(("input", i, name), t)
                  for name, t in make_inputs(op, shape, workload, call.rows, device, compute_dtype).items()}
        if call.strided:
            inputs = {name: strided_copy(t) for name, t in inputs.items()}
        for name, t in inputs.items():
            guard.keep(i, f"input {name}", t)
        for spec in op.inputs:
            if spec.grad and backward:
                inputs[spec.name].requires_grad_(True)
        ctx = CallContext(call, inputs, params, folds, state, shape, workload.lengths)
        result = candidate.run(ctx)
        out_rows = result.rows or call.rows
        outs = []
        for spec in op.outputs:
            if spec.name not in result.tensors:
                raise AdapterError(f"candidate {candidate.impl_id} returned no output {spec.name!r}")
            t = result.tensors[spec.name]
            want = spec.dtype if compute_dtype == torch.bfloat16 else compute_dtype
            if t.dtype != want:
                raise AdapterError(f"{spec.name}: candidate {candidate.impl_id} returned {t.dtype}, the op declares "
                                   f"{want}")
            d, f = dest(spec.name, "forward", t)
            guard.hand(i, spec.name, t, *_restore(workload, out_rows, t, d, f, spec.name))
            if backward and not t.requires_grad:
                raise MissingBackward(spec.name, f"output {spec.name} of {candidate.impl_id} has no grad_fn")
            outs.append(t)
        if not backward:
            continue
        grads = [place(("upstream", i, k), g) for k, g in enumerate(
            make_upstream(op, shape, workload, out_rows, device, None if compute_dtype == torch.bfloat16
                          else compute_dtype))]
        if call.strided:
            grads = [strided_copy(g) for g in grads]
        for spec, g in zip(op.outputs, grads):
            guard.keep(i, f"upstream gradient of {spec.name}", g)
        pending.append(_Pending(call.rows, inputs, outs, grads))
        if schedule == "interleaved":
            torch.autograd.backward(outs, grads, retain_graph=True)
    if schedule == "reverse" or not backward:  # (interleaved: a call's backward runs before the next forward)
        guard.check_outputs(logical)
    if backward:
        if schedule == "reverse":
            for p in reversed(pending):
                torch.autograd.backward(p.outs, p.grads, retain_graph=True)
        _finish_backward(op, candidate, params, folds, starts, state, pending, workload, logical, kinds, dest)
    for name, f in filled.items():
        if not bool(f.all()):
            raise AdapterError(f"{name}: {int((~f).sum())} logical tokens were never produced")
    guard.check_handed(params, {n: decoy_values(t) for n, t in drawn.items()} if decoy else drawn)
    run.tensors = logical
    return run


def _finish_backward(op: OpSpec, candidate: Candidate, params, folds, starts, state, pending, workload,
                     logical, kinds, dest) -> None:
    """Collect input gradients (after every backward), folded input grads and the parameters' main grads."""
    total = workload.num_tokens
    folded: set[str] = set()
    if candidate.folded_input_grads is not None:
        for name, grad in candidate.folded_input_grads(state).items():
            if grad.shape[0] != total:
                raise AdapterError(f"{name}: folded gradient has {grad.shape[0]} rows for {total} tokens")
            logical[name], kinds[name] = grad.detach(), "gradient"
            folded.add(name)
    for p in pending:
        _collect_input_grads(op, p.rows, p.inputs, workload, dest, skip=folded)
    for spec in op.params:
        p = params[spec.name]
        if spec.name in folds:
            if p.grad is not None:
                raise AdapterError(f"{spec.grad}: the kernel folded a main grad AND returned a gradient")
            fold = folds[spec.name]
            if not fold.done:
                missing = fold.total_tiles - fold.cursor
                raise MissingBackward(spec.grad, f"the fold of parameter {spec.name} never completed ({missing} of "
                                      f"{fold.total_tiles} canonical tiles never reached the backward)")
            logical[spec.grad] = fold.finish()
        elif p.grad is None:
            raise MissingBackward(spec.grad, f"parameter {spec.name} received no gradient")
        else:
            logical[spec.grad] = starts[spec.name] + p.grad.detach().float()
        kinds[spec.grad] = "gradient"


def _collect_input_grads(op: OpSpec, rows: RowIdentity, inputs: dict[str, torch.Tensor], workload: Workload,
                         dest, skip: set[str] = frozenset()) -> None:
    for spec in op.inputs:
        if not spec.grad:
            continue
        g = inputs[spec.name].grad
        if spec.grad in skip:
            if g is not None:
                raise AdapterError(f"{spec.grad}: the kernel folded this gradient AND returned it through autograd")
            continue
        if g is None:
            raise MissingBackward(spec.grad, f"input {spec.name} received no gradient")
        d, f = dest(spec.grad, "gradient", g)
        _restore(workload, rows, g, d, f, spec.grad)


def run_reference(op: OpSpec, shape: Shape, workload: Workload, device: torch.device,
                  main_grads: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """FP64 forward and VJP on the logical tokens, from exactly the bf16 values every candidate consumes.

    Inputs, parameters and upstream gradients are the bf16 (or declared-dtype) values, upcast; each
    parameter gradient is added to its starting main grad (``main_grads``, zeros when None).
    """
    rows = workload.logical_rows()
    inputs = make_inputs(op, shape, workload, rows, device, torch.float64)
    inputs = {k: (v.requires_grad_(True) if v.is_floating_point() else v) for k, v in inputs.items()}
    params = {k: v.double().requires_grad_(True) for k, v in make_params(op, shape, workload, device).items()}
    outs = op.reference(inputs, params, shape, rows)
    result = {k: v.detach() for k, v in outs.items()}
    if op.differentiable:
        grads = make_upstream(op, shape, workload, rows, device, torch.float64)
        torch.autograd.backward([outs[s.name] for s in op.outputs], grads)
        for spec in op.inputs:
            if spec.grad:
                result[spec.grad] = inputs[spec.name].grad
        for spec in op.params:
            g = params[spec.name].grad
            start = main_grads.get(spec.name) if main_grads is not None else None
            result[spec.grad] = g if start is None else g + start.double()
    return result
