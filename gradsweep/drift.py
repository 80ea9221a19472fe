"""Drift attribution: where, along an operator chain, a train-style and an inference-style run part.

The same logical tokens go through the same chain of ops (embedding -> rms_norm -> linear -> silu ->
lm_head -> logp by default) twice: once as a trainer batches them (e.g. one packed call) and once as
an inference engine does (e.g. decode, one token per sample per call). Each stage's output is
restored to logical order and compared: the first stage whose bits differ is where drift enters;
the growth of max / mean / p99 differences along the chain is how it spreads to the log-probs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from gradsweep.canonical import RowIdentity
from gradsweep.harness.compare import bitwise_compare
from gradsweep.harness.execute import make_inputs, make_params
from gradsweep.layouts import Call, as_padded
from gradsweep.ops.base import CallContext, Candidate
from gradsweep.ops.registry import get_op
from gradsweep.workload import Workload


@dataclass(frozen=True)
class ChainStage:
    """One op of a chain; ``feeds`` maps its input names to the previous stage's output names."""

    op: str
    shape: Mapping[str, object]
    feeds: Mapping[str, str] = field(default_factory=dict)


def default_chain(hidden: int = 64, inner: int = 96, vocab: int = 300) -> list[ChainStage]:
    """A decoder's token path without attention: every op here has kernels in both families' reach."""
    return [
        ChainStage("embedding", {"vocab": vocab, "hidden": hidden}),
        ChainStage("rms_norm", {"hidden": hidden, "eps": 1e-6}, {"x": "y"}),
        ChainStage("det_gemm", {"in_features": hidden, "out_features": inner}, {"x": "y"}),
        ChainStage("silu", {"features": inner}, {"x": "y"}),
        ChainStage("lm_head", {"hidden": inner, "vocab": vocab}, {"hidden": "y"}),
        ChainStage("logp", {"vocab": vocab}, {"logits": "logits"}),
    ]


@dataclass(frozen=True)
class StageDrift:
    """Differences of one stage's output between the two runs, over all logical tokens."""

    stage: int
    op: str
    tensor: str
    mismatched: int
    numel: int
    max_abs: float
    mean_abs: float
    p99_abs: float
    max_rel: float

    @property
    def bitwise_equal(self) -> bool:
        return self.mismatched == 0


@dataclass
class DriftReport:
    """Per-stage drift plus where it first appears and how it grows."""

    train_layout: str
    infer_layout: str
    stages: list[StageDrift]

    @property
    def first_divergence(self) -> StageDrift | None:
        return next((s for s in self.stages if not s.bitwise_equal), None)

    def growth(self) -> list[float | None]:
        """max_abs of each stage over the previous stage's (None where the previous one is exact)."""
        out: list[float | None] = [None]
        for prev, cur in zip(self.stages, self.stages[1:]):
            out.append(cur.max_abs / prev.max_abs if prev.max_abs > 0 else None)
        return out


def run_chain(stages: Sequence[ChainStage], candidates: Sequence[Candidate], workload: Workload,
              calls: Sequence[Call], device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Forward the chain call by call; return each stage's outputs in logical token order (fp64)."""
    ops = [get_op(s.op) for s in stages]
    params = [make_params(op, dict(s.shape), workload, device) for op, s in zip(ops, stages)]
    total = workload.num_tokens
    logical: list[dict[str, torch.Tensor]] = [{} for _ in stages]
    state: list[dict] = [{} for _ in stages]
    for call in calls:
        prev: dict[str, torch.Tensor] = {}
        prev_rows: RowIdentity | None = None
        for i, (stage, op, cand) in enumerate(zip(stages, ops, candidates)):
            this_call = as_padded(call) if op.padded_input else call
            inputs = make_inputs(op, dict(stage.shape), workload, this_call.rows, device)
            for name, src in stage.feeds.items():
                if prev_rows is not None and prev_rows.num_rows != this_call.rows.num_rows:
                    raise ValueError(f"stage {i} ({stage.op}) changes the rows; it cannot feed the next stage")
                inputs[name] = prev[src]
            ctx = CallContext(this_call, inputs, params[i], {}, state[i], dict(stage.shape), workload.lengths)
            with torch.no_grad():
                out = cand.run(ctx)
            rows = out.rows or this_call.rows
            idx = workload.logical_index(rows)
            real = torch.nonzero(idx >= 0)[:, 0]
            for name, t in out.tensors.items():
                dest = logical[i].setdefault(name, torch.zeros((total, *t.shape[1:]), dtype=torch.float64))
                dest[idx[real]] = t[real.to(t.device)].detach().double().cpu()
            prev, prev_rows = out.tensors, rows
    return logical


def _stats(i: int, op: str, name: str, a: torch.Tensor, b: torch.Tensor, bits_equal: int) -> StageDrift:
    diff = (a - b).abs().flatten()
    if diff.numel() == 0:
        return StageDrift(i, op, name, bits_equal, 0, 0.0, 0.0, 0.0, 0.0)
    rel = diff / b.abs().flatten().clamp(min=1e-30)
    p99 = float(torch.quantile(diff, 0.99)) if diff.numel() <= 1 << 24 else float(diff.kthvalue(
        max(1, int(0.99 * diff.numel()))).values)
    return StageDrift(i, op, name, bits_equal, diff.numel(), float(diff.max()), float(diff.mean()), p99,
                      float(rel.max()))


def attribute_drift(stages: Sequence[ChainStage], candidates: Sequence[Candidate], workload: Workload,
                    train: tuple[str, Sequence[Call]], infer: tuple[str, Sequence[Call]],
                    device: torch.device) -> DriftReport:
    """Run the chain both ways and report, per stage, how far the inference run drifted."""
    a = run_chain(stages, candidates, workload, train[1], device)
    b = run_chain(stages, candidates, workload, infer[1], device)
    out = []
    for i, stage in enumerate(stages):
        for name in a[i]:
            mism = bitwise_compare(a[i][name], b[i][name]).mismatched
            out.append(_stats(i, stage.op, name, b[i][name], a[i][name], mism))
    return DriftReport(train[0], infer[0], out)
