"""Host planning of the canonical fold (issue 13): what ``CanonicalFold`` costs the host per call at 16384 rows,
for a packed step (one call) and a chunked one (every sample in three calls), before any kernel runs. The
fold's planning sits in front of every folded gradient (norm dweight, GEMM dW, embedding, attention dK / dV),
so its host time is what a small-batch step cannot hide.

Two figures per layout: **cold** clears the plan caches before every step (the first fold of a step with new
lengths pays this), **warm** keeps them (every further fold of the step meets the same layout and the same calls:
norms, every GEMM's dW and the embedding each have their own fold, so a trainer's step pays the cold plan once
per layout and tile and the warm one for every other parameter). The target applies to the cold plan."""

from __future__ import annotations

import torch

from gradsweep.bench.baselines import Reference
from gradsweep.bench.cases import Case, irregular
from gradsweep.bench.predicate import CheckRecord
from gradsweep.canonical import CanonicalFold, RowIdentity, clear_plan_caches
from gradsweep.ops.base import Candidate, OpSpec

TILE = 64


def cases(quick: bool) -> list[Case]:
    rows, hidden = (300, 64) if quick else (16384, 4096)
    lengths = irregular(rows, 13)
    common = {"runner": "fold_plan", "baselines": (), "families": ("host",), "split": "none", "check_layouts": ()}
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
    """One step's planning: a fresh fold, then each call's row identities and ``take_tiles`` (else ``take``)."""

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

    def _step(self) -> None:
        if not self.warm:
            clear_plan_caches()
        fold = CanonicalFold(self.main_grad, self.lengths, self.tile)
        take = getattr(fold, "take_tiles", None) or fold.take
        for pieces, tensors in self.calls:
            rows = RowIdentity.packed([p[2] for p in pieces], [p[0] for p in pieces], [p[1] for p in pieces])
            take(rows, tensors)

    def host_step(self, family: str) -> tuple[object, int]:
        return self._step, len(self.calls)

    def family(self, name: str, mode: str) -> Reference:
        return Reference([self._step])

    def reference(self, name: str, mode: str) -> Reference | None:
        return None

    def bitwise(self, family: str) -> CheckRecord | None:
        return None
