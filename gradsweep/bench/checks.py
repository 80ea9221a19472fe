"""The checks behind every timed kernel: a bench figure is only worth reporting for a kernel that keeps its
claims at the shape it was timed at.

- **bitwise, on the timed data** (``bitwise_split``): the timed step's outputs and gradients against the same
  candidate on another layout of the same tokens (the first token alone and the rest as another batch, or
  every sample cut in two calls inside a canonical tile), raw bits after restoring logical order.
- **contract** (``contract_check``): the op's candidate judged by ``gradsweep.harness.kernel_check`` (the
  sweep's one judge) at the case's op shape over the manifest's samples: accuracy against FP64 within the
  contract, bitwise invariance across the requested layouts. No tolerance is written here.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from gradsweep.bench.predicate import CheckRecord
from gradsweep.harness.compare import bitwise_compare
from gradsweep.ops.base import Candidate

SPLIT_NAMES = {"rows": "first token alone + the rest as another batch == one batch",
               "chunks": "every sample in two calls (cut inside a tile, backward in reverse) == one call"}


def compare_logical(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> list[str]:
    """Tensors whose raw bits differ (NaN-aware), each with how many elements and by how much."""
    problems = []
    for name, ref in reference.items():
        if name not in other:
            problems.append(f"{name}: missing from the split run")
            continue
        diff = bitwise_compare(ref, other[name])
        if not diff.equal:
            problems.append(f"{name}: {diff.mismatched}/{ref.numel()} differ (max abs {diff.max_abs:.3g})")
    problems += [f"{name}: only in the split run" for name in other if name not in reference]
    return problems


def bitwise_record(split: str, reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> CheckRecord:
    problems = compare_logical(reference, other)
    names = ", ".join(sorted(reference))
    detail = f"bitwise equal: {names}" if not problems else "; ".join(problems[:6])
    return CheckRecord(name=f"timed data: {SPLIT_NAMES.get(split, split)}", kind="bitwise", passed=not problems,
                       detail=detail)


_CONTRACT_CACHE: dict[tuple, CheckRecord] = {}


def contract_check(op: str, candidate: Candidate, profile: str, shape: dict, lengths: Sequence[int],
                   layouts: Sequence[str], device: torch.device, contract: Path,
                   seed: int | None = None) -> CheckRecord:
    """``check_kernel`` of the candidate at ``shape`` over ``lengths`` (cached per run: cases of one op shape
    share it). Every requested layout the op runs in, plus the reference layout."""
    from gradsweep.harness.kernel_check import check_kernel
    from gradsweep.layouts import REFERENCE_LAYOUT
    from gradsweep.ops.registry import get_op

    spec = get_op(op)
    usable = [lay for lay in layouts if lay in spec.layouts and lay != REFERENCE_LAYOUT]
    if len(lengths) < 2:  # one sample per call IS one call of every sample: a tautology, not a check
        usable = [lay for lay in usable if lay != "b1_singleton"]
    chosen = [REFERENCE_LAYOUT, *usable]
    impl = candidate.impl_id
    key = (op, impl, id(candidate.run), profile, tuple(sorted(shape.items())), tuple(lengths), tuple(chosen),
           str(device), str(contract))
    if key not in _CONTRACT_CACHE:
        report = check_kernel(op, candidate, shape=shape, lengths=list(lengths), layouts=chosen, device=device,
                              seed=seed, contract=contract, profile=profile)
        statuses = ", ".join(f"{lay} {st.value}" for lay, st in report.statuses().items())
        shown = " ".join(f"{k}={v}" for k, v in shape.items())
        detail = f"{statuses} ({shown}, {sum(lengths)} tokens in {len(lengths)} samples)"
        if not report.ok:
            detail = f"{report.first_failure}; {detail}"
        _CONTRACT_CACHE[key] = CheckRecord(name=f"contract: {impl} judged on {', '.join(chosen)}", kind="contract",
                                           passed=report.ok, detail=detail)
    return _CONTRACT_CACHE[key]


def clear_cache() -> None:
    _CONTRACT_CACHE.clear()
