"""What the suite times for one case: the steps of each family and of each reference, and the timed-data check.

``OpSubject`` serves every case whose runner is ``op``: the families' candidates and the stock path run through
the op's declaration (``runner.OpStep``). Cases with a custom runner (attention decode, fold planning) bring
their own subject from the catalog; all subjects answer the same three questions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from gradsweep.bench.baselines import BASELINES, Reference, anchor_reference
from gradsweep.bench.cases import STOCK, Case
from gradsweep.bench.checks import bitwise_record
from gradsweep.bench.data import OpData, rotated
from gradsweep.bench.predicate import CheckRecord
from gradsweep.bench.runner import OpStep, chunked_layout, packed_layout, rows_apart_layout
from gradsweep.ops.base import Candidate, OpSpec

Fn = Callable[[], object]


class Subject(Protocol):
    def family(self, name: str, mode: str) -> Reference: ...

    def reference(self, name: str, mode: str) -> Reference | None: ...

    def bitwise(self, family: str) -> CheckRecord | None: ...

    def host_step(self, family: str) -> tuple[Fn, int]: ...


class OpSubject:
    """A case run through the op's candidates, on rotating copies of device data."""

    def __init__(self, case: Case, op: OpSpec | None, candidates: dict[str, Candidate], device: torch.device,
                 seed: int) -> None:
        if op is None:
            raise ValueError(f"{case.id}: the op runner needs a registered op")
        self.case, self.op, self.candidates, self.device = case, op, candidates, device
        self.copies: list[OpData] = rotated(op, case.shape, case.tokens, device, seed)
        self.stock = op.candidates[f"torch.{op.name}"]

    def _steps(self, candidate: Candidate, mode: str) -> list[Fn]:
        layout = packed_layout(self.case.lengths)
        return [OpStep(self.op, candidate, d, self.case.shape, self.case.lengths, layout, mode, self.case.grads)
                for d in self.copies]

    def family(self, name: str, mode: str) -> Reference:
        return Reference(self._steps(self.candidates[name], mode))

    def reference(self, name: str, mode: str) -> Reference | None:
        if name == STOCK:
            return Reference(self._steps(self.stock, mode))
        if name in BASELINES:
            return Reference([BASELINES[name](self.case, d, mode) for d in self.copies])
        return anchor_reference(name, self.case, self.copies, mode, lambda m: self._steps(self.stock, m))

    def bitwise(self, family: str) -> CheckRecord | None:
        """The timed step against the case's split layout of the same tokens (first data copy)."""
        lengths = self.case.lengths
        layout = {"rows": rows_apart_layout, "chunks": chunked_layout}.get(self.case.split, lambda n: None)(lengths)
        if layout is None:
            return None
        mode = "fwd" if self.case.phase == "fwd" else "fwd_bwd"
        cand, data, shape = self.candidates[family], self.copies[0], self.case.shape
        whole = OpStep(self.op, cand, data, shape, lengths, packed_layout(lengths), mode, self.case.grads).collect()
        split = OpStep(self.op, cand, data, shape, lengths, layout, mode, self.case.grads).collect()
        return bitwise_record(self.case.split, whole, split)

    def host_step(self, family: str) -> tuple[Fn, int]:
        raise ValueError(f"{self.case.id}: op cases are timed on the device, not as host work")
