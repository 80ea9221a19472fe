"""One cell of a manifest (op x profile x layout): classify it, then let ``judge`` run and compare it.

A worker process calls ``run_cell`` for each of its cells; the op's baselines (FP64 reference, starting
main grads, stock runs: the same for every profile) and each candidate's reference-layout run are cached per
process, so a worker computes each once (the runner hands a worker an op's cells of every profile of its pool
one after another).
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch

from gradsweep.contract import load_contract
from gradsweep.harness.execute import forget_drawn
from gradsweep.harness.hardware import check_requirements, resolve_device
from gradsweep.harness.judge import judge, op_baselines, reference_run
from gradsweep.layouts import REFERENCE_LAYOUT, build_calls
from gradsweep.manifest import CandidateStatus, Manifest
from gradsweep.ops.registry import get_op
from gradsweep.results import CellKey, CellResult, Status
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
        for key in [k for k in _CACHE if k[0] in ("run", "base")]:
            del _CACHE[key]
        forget_drawn()
        _CACHE_OP[:] = [ident]
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _keep_run(ident: tuple, impl: str) -> None:
    """Within one op, keep the reference-layout run of this cell's implementation only: a worker pool walks an
    op's cells profile after profile (sweep/runner.py), so another implementation's run is done with, and its
    outputs and gradients (GBs for a vocabulary-wide op) are device memory the next cells need."""
    for key in [k for k in _CACHE if k[0] == "run" and k[1:-1] == ident and k[-1] != impl]:
        del _CACHE[key]


def clear_cache() -> None:
    """Forget cached baselines (tests that change kernels between runs)."""
    _CACHE.clear()


def workload_of(manifest: Manifest) -> Workload:
    s = manifest.samples
    return Workload(manifest.seed, tuple(s.lengths), s.active_fraction)


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
    workload = workload_of(manifest)
    lengths = manifest.samples.lengths

    def calls_of(layout: str):
        return build_calls(layout, manifest.layouts.get(layout), lengths, manifest.seed)

    ref_calls = calls_of(REFERENCE_LAYOUT)
    ident = (str(manifest._source), manifest.name, key.op, str(device))
    _focus(ident)

    def baselines():
        return _cached(("base", *ident), lambda: op_baselines(op, shape, workload, ref_calls, device))

    _keep_run(ident, impl)

    def base_run():
        return _cached(("run", *ident, impl), lambda: reference_run(op, cand, shape, workload, ref_calls, device,
                                                                     baselines()))

    verdict = judge(op, cand, key.layout, calls_of(key.layout), ref_calls, shape, workload, device, contract,
                    key.profile, baselines, base_run, reruns=getattr(manifest, "reruns", 1))
    return CellResult(key=key, status=verdict.status, reason=verdict.reason, candidate=impl,
                      first_failure=verdict.first_failure, tensors=verdict.tensors or [], shape=shape,
                      duration_s=time.perf_counter() - start)
