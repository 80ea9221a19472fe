"""One cell (op x profile x layout): classify, run, compare bitwise to bn_full, judge accuracy.

A worker process calls ``run_cell`` for each of its cells; results of the reference layout, the
FP64 reference and the stock baseline are cached per process so a worker computes each once.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from gradsweep.contract import Contract, load_contract
from gradsweep.harness.accuracy import check_accuracy
from gradsweep.harness.execute import AdapterError, LayoutRun, MissingBackward, run_layout, run_reference
from gradsweep.harness.hardware import check_requirements, resolve_device
from gradsweep.harness.invariance import compare_runs
from gradsweep.layouts import REFERENCE_LAYOUT, build_calls
from gradsweep.manifest import CandidateStatus, Manifest
from gradsweep.ops.base import Candidate, OpSpec
from gradsweep.ops.registry import get_op
from gradsweep.results import CellKey, CellResult, Status, TensorMetrics
from gradsweep.workload import Workload

_CACHE: dict[tuple, Any] = {}
_CACHE_OP: list[tuple] = []


def _cached(key: tuple, fn):
    if key not in _CACHE:
        _CACHE[key] = fn()
    return _CACHE[key]


def _focus(ident: tuple) -> None:
    """Keep cached baselines of one op only: a worker walks its cells op by op, and a vocab-wide op's
    references and main grads take tens of GB of device memory that the next op needs back."""
    if _CACHE_OP != [ident]:
        for key in [k for k in _CACHE if k[0] in ("run", "ref")]:
            del _CACHE[key]
        _CACHE_OP[:] = [ident]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def clear_cache() -> None:
    """Forget cached baselines (tests that change kernels between runs)."""
    _CACHE.clear()


def workload_of(manifest: Manifest) -> Workload:
    s = manifest.samples
    return Workload(manifest.seed, tuple(s.lengths), s.active_fraction)


def stock_candidate(op: OpSpec) -> Candidate | None:
    """The op's stock-PyTorch candidate: the baseline of the accuracy ratio rule."""
    return next((c for c in op.candidates.values() if c.family == "torch"), None)


def layout_run(manifest: Manifest, op: OpSpec, candidate: Candidate, layout: str,
               device: torch.device) -> LayoutRun:
    calls = build_calls(layout, manifest.layouts.get(layout), manifest.samples.lengths, manifest.seed)
    return run_layout(op, candidate, manifest.shape(op.name), workload_of(manifest), calls, device)


def _precheck(manifest: Manifest, key: CellKey) -> tuple[Status, str, str | None] | None:
    """Status of a cell that cannot run (undeclared, missing, skipped, blocked), else None."""
    prof = manifest.profiles[key.profile]
    decl = prof.candidates.get(key.op)
    if decl is None:
        return Status.BLOCKED_C2, f"profile {key.profile} declares no candidate for {key.op}", None
    if decl.status == CandidateStatus.MISSING_REQUIRED:
        track = f" (tracking: {decl.tracking})" if decl.tracking else ""
        return Status.BLOCKED_C2, f"missing_required: {decl.reason}{track}", None
    if decl.status == CandidateStatus.SKIPPED:
        return Status.SKIPPED, f"skipped by declaration: {decl.reason}", decl.impl
    blocked = check_requirements(list(prof.requires))
    if blocked is not None:
        status, why = blocked
        if decl.status == CandidateStatus.OPTIONAL:
            status = Status.SKIPPED
        return status, why, decl.impl
    return None


def run_cell(manifest: Manifest, key: CellKey, candidate: str | None = None) -> CellResult:
    """Run and classify one cell. Raises only on harness bugs (the runner records those as error).

    ``candidate`` runs another implementation id of the op instead of the declared one (``gradsweep
    check --candidate``); it must belong to the profile's family: a profile never borrows.
    """
    start = time.perf_counter()
    shape = manifest.shape(key.op)
    pre = _precheck(manifest, key)
    if pre is not None:
        status, reason, impl = pre
        return CellResult(key=key, status=status, reason=reason, candidate=impl, shape=shape,
                          duration_s=time.perf_counter() - start)
    op = get_op(key.op)
    prof = manifest.profiles[key.profile]
    impl = candidate or prof.candidates[key.op].impl
    if impl not in op.candidates:
        raise ValueError(f"unknown implementation {impl!r} for {key.op}; known: {', '.join(op.candidates)}")
    if op.candidates[impl].family != prof.family:
        raise ValueError(f"{impl!r} is a {op.candidates[impl].family} implementation; profile {key.profile} is "
                         f"{prof.family}: a profile never borrows another family's implementation")
    cand = op.candidates[impl]
    device = resolve_device(prof.device)
    contract = _cached(("contract", str(manifest.contract_path)), lambda: load_contract(manifest.contract_path))
    ident = (str(manifest._source), manifest.name, key.op)
    _focus(ident)
    try:
        base = _cached(("run", *ident, impl, str(device), REFERENCE_LAYOUT),
                       lambda: layout_run(manifest, op, cand, REFERENCE_LAYOUT, device))
        other = layout_run(manifest, op, cand, key.layout, device)
    except MissingBackward as exc:
        return CellResult(key=key, status=Status.RED_NO_BACKWARD, reason=str(exc), candidate=impl, shape=shape,
                          first_failure=f"{exc.tensor}: no gradient path",
                          duration_s=time.perf_counter() - start)
    except AdapterError as exc:
        return CellResult(key=key, status=Status.RED_VERDICT, reason=f"adapter: {exc}", candidate=impl,
                          shape=shape, first_failure=str(exc), duration_s=time.perf_counter() - start)
    label_b = f"{REFERENCE_LAYOUT} (rerun)" if key.layout == REFERENCE_LAYOUT else key.layout
    pairs = compare_runs(base, other, "forward", REFERENCE_LAYOUT, label_b)
    pairs += compare_runs(base, other, "gradient", REFERENCE_LAYOUT, label_b)
    reference = _cached(("ref", *ident, str(device)),
                        lambda: run_reference(op, shape, workload_of(manifest), device))
    stock = stock_candidate(op)
    stock_run = None if stock is None else _cached(
        ("run", *ident, stock.impl_id, str(device), REFERENCE_LAYOUT),
        lambda: layout_run(manifest, op, stock, REFERENCE_LAYOUT, device))
    metrics, failures = _judge(contract, op, key, other, stock_run, reference, pairs)
    status = Status.GREEN if not failures else Status.RED_VERDICT
    return CellResult(key=key, status=status, reason="; ".join(failures[:3]), candidate=impl,
                      first_failure=failures[0] if failures else None, tensors=metrics, shape=shape,
                      duration_s=time.perf_counter() - start)


def _judge(contract: Contract, op: OpSpec, key: CellKey, run: LayoutRun, stock_run: LayoutRun | None,
           reference: dict[str, torch.Tensor], pairs) -> tuple[list[TensorMetrics], list[str]]:
    metrics, failures = [], []
    for pair in pairs:
        name = pair.tensor
        kind = run.kinds.get(name, "forward")
        acc = check_accuracy(contract, op.name, key.profile, name, kind, run.tensors[name],
                             None if stock_run is None else stock_run.tensors.get(name), reference[name])
        d = pair.diff
        metrics.append(TensorMetrics(
            name=name, kind=kind, invariance_check=f"{pair.config_b} vs {pair.config_a}",
            bitwise_equal=d.equal, mismatched_elements=d.mismatched, max_abs=_finite(d.max_abs),
            max_rel=_finite(d.max_rel), accuracy_error=_finite(acc.error), stock_error=_finite(acc.stock_error),
            accuracy_bound=_finite(acc.bound), accuracy_ok=acc.ok))
        if not d.equal:
            failures.append(f"{name} {kind}_invariance: {pair.describe()}")
        if not acc.ok:
            failures.append(f"{name} {kind}_accuracy: error {acc.error:.3g} > bound {acc.bound:.3g} "
                            f"(stock {acc.stock_error:.3g})")
    return metrics, failures


def _finite(x: float) -> float:
    """JSON has no inf/NaN: clamp to the largest double so evidence stays canonical JSON."""
    if x != x:
        return float("1.7976931348623157e308")
    return min(x, 1.7976931348623157e308)
