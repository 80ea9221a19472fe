"""The bench's fold_plan rows time each family's own fold call: the Triton family's ``take_tiles`` and the CUDA
family's ``take``, each with that family's piece copy, as the families' kernels call them (a row that timed a
staging path no production fold takes would report a figure no training step pays)."""

from __future__ import annotations

import pytest
import torch

from gradsweep import canonical
from gradsweep.bench.catalog import fold_plan
from gradsweep.cuda_kernels import stage_copy as cuda_stage
from gradsweep.triton_kernels import stage_copy as triton_stage


def _spied(monkeypatch) -> list[tuple[str, object]]:
    """Every fold call of the step: (method, stage_copy), the calls themselves stubbed (no kernel runs)."""
    seen: list[tuple[str, object]] = []
    for method in ("take", "take_tiles"):
        monkeypatch.setattr(canonical.CanonicalFold, method,
                            lambda self, rows, tensors, stage_copy=None, _m=method: seen.append((_m, stage_copy)))
    return seen


@pytest.mark.parametrize("family, method, copy", [("triton", "take_tiles", triton_stage.copy_pieces),
                                                  ("cuda", "take", cuda_stage.copy_pieces)])
def test_each_family_times_its_own_fold_call(monkeypatch, family, method, copy):
    seen = _spied(monkeypatch)
    chunked = next(c for c in fold_plan.cases(True) if c.name == "chunked")
    fn, calls = fold_plan.PlanSubject(chunked, None, {}, torch.device("cpu"), 0).host_step(family)
    fn()
    assert calls == 3 and seen == [(method, copy)] * 3, seen
    assert fold_plan.impl_label(family).startswith(f"gradsweep.canonical.CanonicalFold.{method} + {family} ")


def test_every_case_names_both_families_and_an_unknown_family_is_refused():
    assert all(c.families == ("triton", "cuda") for c in fold_plan.cases(True))
    with pytest.raises(ValueError, match="no fold call known for family 'host'"):
        fold_plan.family_take("host")
