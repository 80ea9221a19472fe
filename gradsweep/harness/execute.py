"""Run one candidate over one layout's calls and restore every result to logical identity.

The harness owns the inputs (from logical identity), the upstream gradients, the loss mask and
the aggregation across calls; the candidate only sees physical rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.layouts import Call, as_padded
from gradsweep.ops.base import CallContext, Candidate, OpSpec, Shape
from gradsweep.workload import Workload


class MissingBackward(Exception):
    """A candidate produced no gradient path for a named tensor (status red_no_backward)."""

    def __init__(self, tensor: str, detail: str) -> None:
        super().__init__(f"no gradient for {tensor}: {detail}")
        self.tensor = tensor


class AdapterError(Exception):
    """A candidate's outputs do not cover the logical tokens exactly once (wrong rows or shapes)."""


@dataclass
class LayoutRun:
    """Logical results of one candidate over one layout: name -> tensor, plus how it was called."""

    tensors: dict[str, torch.Tensor]
    kinds: dict[str, str]
    call_rows: list[int] = field(default_factory=list)
    padded_calls: int = 0


_PARAMS: dict[tuple, dict[str, torch.Tensor]] = {}


def make_params(op: OpSpec, shape: Shape, workload: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    """Parameters from (seed, name), bf16 on the device (fresh tensors each call).

    Drawing a 151936 x 4096 table takes seconds on the host, so a worker draws each one once.
    """
    key = (op.name, tuple(sorted(shape.items())), workload.seed, str(device))
    if key not in _PARAMS:
        if len(_PARAMS) >= 4:
            _PARAMS.clear()
        _PARAMS[key] = {p.name: (workload.params(p.name, p.shape(shape), p.scale(shape), torch.float32, "cpu")
                                 + p.offset).to(torch.bfloat16).to(device)
                        for p in op.params}
    return {name: t.clone() for name, t in _PARAMS[key].items()}


def make_inputs(op: OpSpec, shape: Shape, workload: Workload, rows: RowIdentity, device: torch.device,
                dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Per-row inputs from logical identity (pads: garbage that can never pass for a token)."""
    out = {}
    for spec in op.inputs:
        if spec.is_index:
            out[spec.name] = workload.indices(f"in:{spec.name}", rows, spec.index_high(shape), device)
        else:
            out[spec.name] = workload.values(f"in:{spec.name}", rows, spec.feature(shape), spec.scale,
                                             device, dtype)
    return out


def _restore(workload: Workload, rows: RowIdentity, physical: torch.Tensor, dest: torch.Tensor,
             filled: torch.Tensor, name: str) -> None:
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


def run_layout(op: OpSpec, candidate: Candidate, shape: Shape, workload: Workload, calls: Sequence[Call],
               device: torch.device, backward: bool = True) -> LayoutRun:
    """Run every call, backward with the harness's upstream gradients, restore to logical order."""
    total = workload.num_tokens
    params = {n: t.clone().requires_grad_(backward) for n, t in make_params(op, shape, workload, device).items()}
    folds: dict[str, CanonicalFold] = {}
    if candidate.param_grads == "fold" and backward:
        tiles = candidate.fold_tiles()
        folds = {n: CanonicalFold(torch.zeros(t.shape, dtype=torch.float32, device=device), workload.lengths,
                                  tiles[n]) for n, t in params.items()}
    state: dict = {}
    logical: dict[str, torch.Tensor] = {}
    filled: dict[str, torch.Tensor] = {}
    kinds: dict[str, str] = {}
    pending: list[tuple[RowIdentity, dict[str, torch.Tensor]]] = []
    outs_all: list[torch.Tensor] = []
    grads_all: list[torch.Tensor] = []
    run = LayoutRun({}, kinds)

    def dest(name: str, kind: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if name not in logical:
            logical[name] = torch.zeros((total, *like.shape[1:]), dtype=like.dtype, device=like.device)
            filled[name] = torch.zeros(total, dtype=torch.bool)
            kinds[name] = kind
        return logical[name], filled[name]

    for call in calls:
        call = as_padded(call) if op.padded_input else call
        run.call_rows.append(call.num_rows)
        run.padded_calls += call.padded is not None
        inputs = make_inputs(op, shape, workload, call.rows, device)
        for spec in op.inputs:
            if spec.grad and backward:
                inputs[spec.name].requires_grad_(True)
        ctx = CallContext(call, inputs, params, folds, state, shape, workload.lengths)
        result = candidate.run(ctx)
        out_rows = result.rows or call.rows
        outs, grads = [], []
        for spec in op.outputs:
            if spec.name not in result.tensors:
                raise AdapterError(f"candidate {candidate.impl_id} returned no output {spec.name!r}")
            t = result.tensors[spec.name]
            d, f = dest(spec.name, "forward", t)
            _restore(workload, out_rows, t, d, f, spec.name)
            if backward:
                if not t.requires_grad:
                    raise MissingBackward(spec.name, f"output {spec.name} of {candidate.impl_id} has no grad_fn")
                outs.append(t)
                grads.append(workload.upstream(spec.name, out_rows, spec.feature(shape), device, t.dtype))
        if not backward:
            continue
        if op.backward_scope == "call":
            torch.autograd.backward(outs, grads)
            _collect_input_grads(op, call.rows, inputs, workload, dest)
        else:
            outs_all += outs
            grads_all += grads
            pending.append((call.rows, inputs))
    folded = set()
    if backward and op.backward_scope == "layout":
        torch.autograd.backward(outs_all, grads_all)
        if candidate.folded_input_grads is not None:
            for name, grad in candidate.folded_input_grads(state).items():
                if grad.shape[0] != total:
                    raise AdapterError(f"{name}: folded gradient has {grad.shape[0]} rows for {total} tokens")
                logical[name], kinds[name] = grad.detach(), "gradient"
                folded.add(name)
        for rows, inputs in pending:
            _collect_input_grads(op, rows, inputs, workload, dest, skip=folded)
    if backward:
        for spec in op.params:
            p = params[spec.name]
            if spec.name in folds:
                if p.grad is not None:
                    raise AdapterError(f"{spec.grad}: the kernel folded a main grad AND returned a gradient")
                logical[spec.grad] = folds[spec.name].finish()
            elif p.grad is None:
                raise MissingBackward(spec.grad, f"parameter {spec.name} received no gradient")
            else:
                logical[spec.grad] = p.grad.detach()
            kinds[spec.grad] = "gradient"
    for name, f in filled.items():
        if not bool(f.all()):
            raise AdapterError(f"{name}: {int((~f).sum())} logical tokens were never produced")
    run.tensors = logical
    return run


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


def run_reference(op: OpSpec, shape: Shape, workload: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    """FP64 forward and VJP on the logical tokens (bf16-rounded inputs and parameters, upcast)."""
    rows = workload.logical_rows()
    inputs = make_inputs(op, shape, workload, rows, device)
    inputs = {k: (v.double().requires_grad_(True) if v.is_floating_point() else v) for k, v in inputs.items()}
    params = {k: v.double().requires_grad_(True) for k, v in make_params(op, shape, workload, device).items()}
    outs = op.reference(inputs, params, shape, rows)
    result = {k: v.detach() for k, v in outs.items()}
    if op.differentiable:
        grads = [workload.upstream(spec.name, rows, spec.feature(shape), device) for spec in op.outputs]
        torch.autograd.backward([outs[s.name] for s in op.outputs], grads)
        for spec in op.inputs:
            if spec.grad:
                result[spec.grad] = inputs[spec.name].grad
        for spec in op.params:
            result[spec.grad] = params[spec.name].grad
    return result
