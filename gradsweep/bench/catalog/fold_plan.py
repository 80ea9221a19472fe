"""Host planning of the canonical fold (issue 13): what ``CanonicalFold`` costs the host per call at 16384 rows,
for a packed step (one call) and a chunked one (every sample in three calls), before any fold kernel runs. The
fold's planning sits in front of every folded gradient (norm dweight, GEMM dW, embedding, attention dK / dV),
so its host time is what a small-batch step cannot hide.

Each family is timed on the fold call its own kernels make (``family_take``): the Triton family's tile
descriptors (``take_tiles``), the CUDA family's row table (``take``), each staging the carried rows with its own
piece copy. So the host time is the plan, its uploads and the staging copies' launches that a training step of
that family pays; a family whose profile cannot run here is blocked like any other.

Two figures per layout: **cold** clears the plan caches before every step (the first fold of a step with new
lengths pays this), **warm** keeps them (every further fold of the step meets the same layout and the same calls:
norms, every GEMM's dW and the embedding each have their own fold, so a trainer's step pays the cold plan once
per layout and tile and the warm one for every other parameter). The target applies to the cold plan."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradsweep.bench.baselines import Reference
from gradsweep.bench.cases import Case, irregular
from gradsweep.bench.predicate import CheckRecord
from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches, planner
from gradsweep.ops.base import Candidate, OpSpec

TILE = 64
FAMILIES = ("triton", "cuda")

Take = Callable[[CanonicalFold, RowIdentity, tuple[torch.Tensor, ...]], object]


def family_take(family: str) -> Take:
    """The fold call of ``family``'s kernels (gradsweep/<family>_kernels: rms_norm, GEMM dW, embedding, ...)."""
    if family == "triton":
        from gradsweep.triton_kernels.stage_copy import copy_pieces as triton_copy

        return lambda fold, rows, tensors: fold.take_tiles(rows, tensors, stage_copy=triton_copy)
    if family == "cuda":
        from gradsweep.cuda_kernels.stage_copy import copy_pieces as cuda_copy

        return lambda fold, rows, tensors: fold.take(rows, tensors, stage_copy=cuda_copy)
    raise ValueError(f"fold_plan: no fold call known for family {family!r} (known: {', '.join(FAMILIES)})")


def impl_label(family: str) -> str:
    """What a family's row timed: the fold call, its staging copy and the planner that ran."""
    call = {"triton": "take_tiles", "cuda": "take"}.get(family, "?")
    return f"gradsweep.canonical.CanonicalFold.{call} + {family} copy_pieces (planner: {planner()})"


def cases(quick: bool) -> list[Case]:
    rows, hidden = (300, 64) if quick else (16384, 4096)
    lengths = irregular(rows, 13)
    common = {"runner": "fold_plan", "baselines": (), "families": FAMILIES, "split": "none", "check_layouts": ()}
    out = []
    for calls, name, how in ((1, "packed", "one call"), (3, "chunked", "three calls")):
        for warm in (False, True):
            out.append(Case("fold_plan", name + ("_warm" if warm else ""),
                            f"fold plan, {rows} rows in 13 samples, {how}, tile {TILE}, "
                            + ("warm (a further fold of the step)" if warm else "cold (caches cleared)"),
                            {"hidden": hidden, "tile": TILE}, lengths, "fwd", extra={"calls": calls, "warm": warm},
                            **common))
    return out


def _thirds(n: int) -> list[int]:
    a = n // 3 + (1 if n > 8 else 0)
    b = (n - a) // 2
    return [a, b, n - a - b]


class PlanSubject:
    """One step's planning: a fresh fold, then each call's row identities and the family's fold call."""

    def __init__(self, case: Case, op: OpSpec | None, candidates: dict[str, Candidate], device: torch.device,
                 seed: int) -> None:
        self.case = case
        hidden, lengths = int(case.shape["hidden"]), [int(n) for n in case.lengths]
        self.lengths, self.tile = lengths, int(case.shape["tile"])
        self.main_grad = torch.zeros(hidden, dtype=torch.float32, device=device)
        self.warm = bool(case.extra.get("warm", False))
        n_calls = int(case.extra["calls"])
        cuts = [_thirds(n) if n_calls == 3 else [n] for n in lengths]
        self.calls = []
        for k in range(n_calls):
            pieces = [(s, sum(c[:k]), c[k]) for s, c in enumerate(cuts) if k < len(c) and c[k] > 0]
            rows = sum(p[2] for p in pieces)
            gen = torch.Generator(device=device).manual_seed(seed + k)
            x = torch.randn(rows, hidden, generator=gen, device=device).to(torch.bfloat16)
            self.calls.append((pieces, (x, x)))

    def _step(self, take: Take) -> None:
        if not self.warm:
            clear_plan_caches()
        fold = CanonicalFold(self.main_grad, self.lengths, self.tile)
        for pieces, tensors in self.calls:
            rows = RowIdentity.packed([p[2] for p in pieces], [p[0] for p in pieces], [p[1] for p in pieces])
            take(fold, rows, tensors)

    def host_step(self, family: str) -> tuple[Callable[[], None], int]:
        take = family_take(family)
        return (lambda: self._step(take)), len(self.calls)

    def family(self, name: str, mode: str) -> Reference:
        return Reference([self.host_step(name)[0]])

    def reference(self, name: str, mode: str) -> Reference | None:
        return None

    def bitwise(self, family: str) -> CheckRecord | None:
        return None
