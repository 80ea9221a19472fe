"""The public kernel check: one candidate of an existing op over layouts, judged by the sweep's own machinery.

Tests, benches and users call this instead of writing their own layouts, comparators or bounds:

    from gradsweep.harness.kernel_check import check_kernel
    report = check_kernel("rms_norm", "triton.rms_norm")           # a shipped candidate
    report = check_kernel("rms_norm", my_candidate)                # your own ops.base.Candidate
    assert report.ok, report.first_failure

Defaults (samples, layouts and their parameters, the op's shape, the contract) come from the default
manifest, whose workload crosses canonical tiles, puts chunk boundaries on and off tile boundaries and
holds a one-token sample; pass ``lengths`` / ``shape`` / ``layouts`` to change them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gradsweep.contract import Contract, load_contract
from gradsweep.families import FAMILIES
from gradsweep.harness.judge import OpBaselines, Verdict, judge, op_baselines, reference_run
from gradsweep.layouts import REFERENCE_LAYOUT, build_calls
from gradsweep.manifest import DEFAULT_MANIFEST, LayoutSpec, Manifest, load_manifest
from gradsweep.ops.base import CallContext, CallOutput, Candidate, OpSpec
from gradsweep.ops.registry import get_op
from gradsweep.results import Status
from gradsweep.workload import Workload


@dataclass
class KernelReport:
    """Verdicts of one candidate per layout; ``ok`` when every layout is green."""

    op: str
    candidate: str
    cells: dict[str, Verdict] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(v.status == Status.GREEN for v in self.cells.values())

    @property
    def status(self) -> Status:
        """The worst status over layouts (error, red_no_backward, red_verdict, green)."""
        order = (Status.ERROR, Status.RED_NO_BACKWARD, Status.RED_VERDICT, Status.GREEN)
        found = {v.status for v in self.cells.values()}
        return next((s for s in order if s in found), Status.GREEN)

    @property
    def first_failure(self) -> str | None:
        bad = next(((lay, v) for lay, v in self.cells.items() if v.status != Status.GREEN), None)
        return None if bad is None else f"{self.op}/{self.candidate}/{bad[0]}: {bad[1].first_failure or bad[1].reason}"

    def statuses(self) -> dict[str, Status]:
        return {lay: v.status for lay, v in self.cells.items()}


def _default_manifest() -> Manifest:
    return load_manifest(DEFAULT_MANIFEST)


def as_candidate(op: OpSpec, candidate: str | Candidate) -> Candidate:
    """An implementation id of the op (e.g. 'triton.rms_norm') or a Candidate built by the caller."""
    if isinstance(candidate, Candidate):
        return candidate
    if candidate not in op.candidates:
        raise ValueError(f"unknown implementation {candidate!r} for {op.name}; known: {', '.join(op.candidates)}")
    return op.candidates[candidate]


def check_kernel(op: str | OpSpec, candidate: str | Candidate, *, shape: dict[str, Any] | None = None,
                 lengths: Sequence[int] | None = None, layouts: Sequence[str] | None = None,
                 layout_specs: dict[str, LayoutSpec | dict] | None = None, device: str | torch.device = "cpu",
                 seed: int | None = None, reruns: int = 1, contract: Contract | str | Path | None = None,
                 profile: str = "check") -> KernelReport:
    """Judge ``candidate`` on every requested layout exactly as a sweep cell would be judged.

    ``layout_specs`` override layout parameters (chunks, order, fillers, groups, prefix); when ``lengths``
    differ from the default manifest's, the default parameters that depend on them are dropped
    (seeded defaults are used instead).
    """
    spec = op if isinstance(op, OpSpec) else get_op(op)
    cand = as_candidate(spec, candidate)
    base = _default_manifest()
    sample_lengths = list(lengths) if lengths is not None else list(base.samples.lengths)
    same_samples = sample_lengths == list(base.samples.lengths)
    run_seed = base.seed if seed is None else seed
    op_shape = spec.shape_model.model_validate(
        shape if shape is not None else (base.shape(spec.name) if spec.name in base.ops else {})
    ).model_dump(exclude_none=True)
    specs: dict[str, LayoutSpec | None] = {name: (s if same_samples else None) for name, s in base.layouts.items()}
    for name, s in (layout_specs or {}).items():
        specs[name] = s if isinstance(s, LayoutSpec) else LayoutSpec.model_validate(s)
    chosen = [lay for lay in (layouts or spec.layouts) if lay in spec.layouts]
    if layouts is not None and len(chosen) != len(list(layouts)):
        raise ValueError(f"{spec.name} does not run in {sorted(set(layouts) - set(chosen))}; its layouts: "
                         f"{', '.join(spec.layouts)}")
    rules = contract if isinstance(contract, Contract) else load_contract(contract or base.contract_path)
    workload = Workload(run_seed, tuple(sample_lengths), base.samples.active_fraction)
    dev = torch.device(device)

    def calls_of(layout: str):
        return build_calls(layout, specs.get(layout), sample_lengths, run_seed)

    ref_calls = calls_of(REFERENCE_LAYOUT)
    cache: dict[str, Any] = {}

    def baselines() -> OpBaselines:
        if "base" not in cache:
            cache["base"] = op_baselines(spec, op_shape, workload, ref_calls, dev)
        return cache["base"]

    def base_run():
        if "run" not in cache:
            cache["run"] = reference_run(spec, cand, op_shape, workload, ref_calls, dev, baselines())
        return cache["run"]

    report = KernelReport(spec.name, cand.impl_id)
    for lay in chosen:
        report.cells[lay] = judge(spec, cand, lay, calls_of(lay), ref_calls, op_shape, workload, dev, rules,
                                  profile, baselines, base_run, reruns=reruns)
    return report


def candidate_from(op: str | OpSpec, impl_id: str, family: str, run: Callable[[CallContext], CallOutput],
                   **kwargs: Any) -> Candidate:
    """Wrap your own adapter ``run(ctx) -> CallOutput`` as a Candidate of an existing op (see README).

    ``kwargs`` are Candidate's: ``param_grads="fold"`` with ``fold_tiles`` for a kernel that folds
    parameter gradients itself, ``folded_input_grads`` for one that folds input gradients across calls.
    """
    spec = op if isinstance(op, OpSpec) else get_op(op)
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")
    if impl_id in spec.candidates:
        raise ValueError(f"{impl_id!r} is already a candidate of {spec.name}; pick another id")
    return Candidate(impl_id, family, run, **kwargs)  # type: ignore[arg-type]
