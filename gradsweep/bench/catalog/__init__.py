"""Every bench case, as data, one module per op family; ``--quick`` gets tiny shapes of the same cases.

An op of the manifest with no declared case still gets one (``default_cases``): forward and backward at the
manifest's shape over 16384 tokens (the manifest's samples in --quick), so the suite covers every op. The
step-level cases (the chain's training step, the fold's host planning) belong to every run.
"""

from __future__ import annotations

from collections.abc import Sequence

from gradsweep.bench.cases import Case, irregular
from gradsweep.bench.catalog import attention, chain, fold_plan, gemm, rowwise, vocab

MODULES = (gemm, rowwise, vocab, attention, chain, fold_plan)
STEP_OPS = ("chain", "fold_plan")  # not swept per op: run whenever --op does not exclude them
RUNNERS = {"attention_decode": attention.DecodeSubject, "fold_plan": fold_plan.PlanSubject}
HOST_IMPLS = {"fold_plan": fold_plan.impl_label}  # host-only runners: what a family's row of them times
DEFAULT_TOKENS = 16384
QUICK_CHECK_LENGTHS = (9, 3, 14)  # the contract checks' samples in --quick (a full run uses the manifest's)


def catalog(quick: bool) -> list[Case]:
    """Every declared case (full shapes, or the --quick ones)."""
    out = [c for module in MODULES for c in module.cases(quick)]
    ids = [c.id for c in out]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ValueError(f"bench catalog: case ids declared twice: {', '.join(sorted(dup))}")
    return out


def default_cases(op: str, shape: dict, sample_lengths: Sequence[int], quick: bool,
                  differentiable: bool = True) -> list[Case]:
    """Forward (and backward) of an op the catalog does not declare, at the manifest's shape."""
    lengths = tuple(sample_lengths) if quick else irregular(DEFAULT_TOKENS, 13)
    title = f"{sum(lengths)} tokens, manifest shape"
    out = [Case(op, "fwd", f"fwd {title}", dict(shape), lengths, "fwd", split="rows")]
    if differentiable:
        out.append(Case(op, "bwd", f"bwd {title}", dict(shape), lengths, "bwd"))
    return out
