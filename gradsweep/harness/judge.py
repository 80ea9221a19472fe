"""Judge one candidate on one layout: bitwise invariance against the reference layout, accuracy against FP64.

This is the single place where a verdict is made. The sweep (``cell.run_cell``) and the public kernel
check (``kernel_check.check_kernel``) both call it, so a user's own kernel, a test and the release
sweep are judged by the same machinery.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch

from gradsweep.contract import Contract
from gradsweep.harness.accuracy import AccuracyCheck, baseline_accuracy, check_accuracy
from gradsweep.harness.compare import normwise_error
from gradsweep.harness.execute import (
    AdapterError,
    Arena,
    LayoutRun,
    MissingBackward,
    exact_fp32,
    main_grad_starts,
    run_layout,
    run_reference,
)
from gradsweep.harness.invariance import PairResult, compare_runs
from gradsweep.layouts import REFERENCE_LAYOUT, Call, as_padded, same_physical_calls, schedules_for
from gradsweep.ops.base import Candidate, OpSpec, Shape
from gradsweep.results import Status, TensorMetrics
from gradsweep.workload import Workload

_LARGEST = 1.7976931348623157e308
# Baselines holding more than this share of the device's memory wait in host memory between cells (the release
# chain's ~27 GB of FP64 reference grads and stock runs on an 80 GB H100; on a 141 GB H200 they stay on the device)
PARK_FRACTION = 0.25


class TautologicalCell(Exception):
    """A layout that hands the operator exactly the reference layout's calls: its cell would prove nothing."""


@dataclass
class OpBaselines:
    """What every cell of one op is judged against (computed once per op, workload and device)."""

    reference: dict[str, torch.Tensor]   # FP64, on the same bf16 values, main grads included
    starts: dict[str, torch.Tensor]      # FP32 main grad each parameter starts from, by parameter name
    grad_starts: dict[str, torch.Tensor]  # the same, by gradient name
    stock_bf16: LayoutRun                # the op's stock path on the reference layout
    stock_fp32: LayoutRun                # the stock path in FP32 (TF32 off) on the same bf16 values
    device: torch.device | None = None   # where the cells run and every comparison computes (None: the host)
    parked: bool = False                 # reference and stock runs wait in host memory (``park_baselines``)
    stock_errors: dict[tuple[str, str], float] = field(default_factory=dict)  # (tensor, class) -> stock error

    def stock_error(self, name: str, accumulation: str) -> float:
        """The stock run's error in ``accumulation``'s class, computed once per op (every cell of every profile
        is bounded by the same figure; parked, each computation is an upload of the reference). 0.0 where the
        stock run has no such tensor: the bound is then the contract's floor alone."""
        key = (name, accumulation)
        if key not in self.stock_errors:
            run = self.stock_fp32 if accumulation == "fp32" else self.stock_bf16
            stock = run.tensors.get(name)
            self.stock_errors[key] = 0.0 if stock is None else \
                normwise_error(stock, self.reference[name], self.grad_starts.get(name), device=self.device)
        return self.stock_errors[key]


def _nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _held(b: OpBaselines) -> list[torch.Tensor]:
    """What parking moves: the FP64 reference and both stock runs (the starts stay: every run starts from them)."""
    return [*b.reference.values(), *b.stock_bf16.tensors.values(), *b.stock_fp32.tensors.values()]


def should_park(nbytes: int, device_bytes: int, fraction: float | None = None) -> bool:
    """Park baselines of ``nbytes`` on a device of ``device_bytes`` when they exceed ``fraction`` of it."""
    return nbytes > (PARK_FRACTION if fraction is None else fraction) * device_bytes


def park_baselines(b: OpBaselines) -> OpBaselines:
    """The same baselines with the reference and the stock runs in host memory. Every comparison walks its
    tensors slice by slice on the candidate's device (harness/compare.py), so each use uploads at most one slice
    at a time, and no verdict can move: the same bits meet the same arithmetic."""
    def host(run: LayoutRun) -> LayoutRun:
        return replace(run, tensors={n: t.detach().cpu() for n, t in run.tensors.items()})

    return replace(b, reference={n: t.cpu() for n, t in b.reference.items()}, stock_bf16=host(b.stock_bf16),
                   stock_fp32=host(b.stock_fp32), parked=True, stock_errors={})


def _maybe_park(b: OpBaselines, device: torch.device) -> OpBaselines:
    """``b`` parked when it is large for ``device``. The device copies are freed once the caller drops ``b``
    (the caching allocator reuses them for the cells; nothing here can return them to the driver earlier)."""
    if device.type != "cuda" or not should_park(_nbytes(_held(b)), torch.cuda.get_device_properties(device)
                                                .total_memory):
        return b
    return park_baselines(b)


@dataclass
class Verdict:
    status: Status
    reason: str = ""
    first_failure: str | None = None
    tensors: list[TensorMetrics] | None = None


def stock_candidate(op: OpSpec) -> Candidate:
    """The op's declared stock path as a candidate (the accuracy baseline; never a kernel)."""
    return op.candidates[f"torch.{op.name}"]


def _rms(t: torch.Tensor) -> float:
    t = t.detach().double()
    value = float(torch.linalg.vector_norm(t)) / math.sqrt(max(t.numel(), 1))
    return value if value > 0 else 1.0


def op_baselines(op: OpSpec, shape: Shape, workload: Workload, ref_calls: Sequence[Call],
                 device: torch.device) -> OpBaselines:
    """FP64 reference, starting main grads (RMS of this step's own gradient), stock bf16 and FP32 runs."""
    plain = run_reference(op, shape, workload, device)
    scales = {p.grad: _rms(plain[p.grad]) for p in op.params if p.grad in plain}
    starts = main_grad_starts(op, shape, workload, scales, device)
    reference = dict(plain)
    for p in op.params:
        if p.grad in reference:
            reference[p.grad] = plain[p.grad] + starts[p.name].double()
    stock = stock_candidate(op)
    stock_bf16 = run_layout(op, stock, shape, workload, ref_calls, device, main_grads=starts,
                            backward=op.differentiable)
    with exact_fp32():
        stock_fp32 = run_layout(op, stock, shape, workload, ref_calls, device, main_grads=starts,
                                backward=op.differentiable, compute_dtype=torch.float32)
    return _maybe_park(OpBaselines(reference, starts, {p.grad: starts[p.name] for p in op.params}, stock_bf16,
                                   stock_fp32, device=device), device)


def reference_run(op: OpSpec, candidate: Candidate, shape: Shape, workload: Workload, ref_calls: Sequence[Call],
                  device: torch.device, baselines: OpBaselines) -> LayoutRun:
    """The candidate on the reference layout: what every other layout of the cell is compared with."""
    return run_layout(op, candidate, shape, workload, ref_calls, device, main_grads=baselines.starts,
                      backward=op.differentiable)


def judge(op: OpSpec, candidate: Candidate, layout: str, calls: Sequence[Call], ref_calls: Sequence[Call],
          shape: Shape, workload: Workload, device: torch.device, contract: Contract, profile: str,
          baselines: Callable[[], OpBaselines], base_run: Callable[[], LayoutRun], reruns: int = 1) -> Verdict:
    """Run the candidate on ``layout`` (every backward order it is checked under) and classify the cell.

    The reference layout's cell re-runs it ``reruns`` times (nondeterminism), the last time in the buffers of a
    run on other values (a result keyed on an address, not on contents: ``execute.Arena``); any other layout must
    hand the operator different calls than the reference layout (else the cell is a tautology).
    """
    try:
        base_line = baselines()
        base = base_run()
        runs: list[tuple[str, LayoutRun]] = []
        if layout == REFERENCE_LAYOUT:
            n = max(1, reruns)
            for i in range(n):
                label = f"{REFERENCE_LAYOUT} (rerun {i + 1}/{n}" if n > 1 else f"{REFERENCE_LAYOUT} (rerun"
                arena = None
                if i == n - 1:  # the last rerun in the buffers of a run on other values (execute.Arena)
                    arena = Arena()
                    run_layout(op, candidate, shape, workload, calls, device, main_grads=base_line.starts,
                               backward=op.differentiable, arena=arena, decoy=True)
                    label += ", in the buffers of a run on other values"
                runs.append((label + ")", run_layout(op, candidate, shape, workload, calls, device,
                                                     main_grads=base_line.starts, backward=op.differentiable,
                                                     arena=arena)))
        else:
            check_not_tautological(op, layout, calls, ref_calls)
            for sched in schedules_for(layout, len(calls)):
                label = layout if sched == "reverse" else f"{layout} [{sched} backward]"
                runs.append((label, run_layout(op, candidate, shape, workload, calls, device, schedule=sched,
                                               main_grads=base_line.starts, backward=op.differentiable)))
    except MissingBackward as exc:
        return Verdict(Status.RED_NO_BACKWARD, str(exc), f"{exc.tensor}: no gradient path")
    except AdapterError as exc:
        return Verdict(Status.RED_VERDICT, f"adapter: {exc}", str(exc))
    except TautologicalCell as exc:
        return Verdict(Status.ERROR, str(exc), str(exc))
    pairs: list[PairResult] = []
    for label, run in runs:
        pairs += compare_runs(base, run, "forward", REFERENCE_LAYOUT, label)
        pairs += compare_runs(base, run, "gradient", REFERENCE_LAYOUT, label)
    is_baseline = candidate.run is op.stock and layout == REFERENCE_LAYOUT
    metrics, failures = _metrics(contract, op, candidate, profile, runs[0][1], base_line, pairs, is_baseline)
    status = Status.GREEN if not failures else Status.RED_VERDICT
    return Verdict(status, "; ".join(failures[:3]), failures[0] if failures else None, metrics)


def check_not_tautological(op: OpSpec, layout: str, calls: Sequence[Call], ref_calls: Sequence[Call]) -> None:
    """Refuse a layout whose calls are physically the reference layout's (after the op's own padding)."""
    def phys(cs: Sequence[Call]) -> list[Call]:
        return [as_padded(c) for c in cs] if op.padded_input else list(cs)

    if same_physical_calls(phys(calls), phys(ref_calls)):
        raise TautologicalCell(f"layout {layout} hands {op.name} exactly the calls of {REFERENCE_LAYOUT}: the cell "
                               f"would compare a computation with itself; drop {layout} from the op's layouts")


def _metrics(contract: Contract, op: OpSpec, candidate: Candidate, profile: str, run: LayoutRun,
             base_line: OpBaselines, pairs: list[PairResult], is_baseline: bool
             ) -> tuple[list[TensorMetrics], list[str]]:
    metrics, failures, judged = [], [], set()
    for pair in pairs:
        name = pair.tensor
        kind = run.kinds.get(name, "forward")
        acc = None
        if name not in judged:  # accuracy once per tensor (on the first run of the layout)
            judged.add(name)
            acc = _accuracy(contract, op, candidate, profile, name, kind, run, base_line, is_baseline)
        d = pair.diff
        metrics.append(TensorMetrics(
            name=name, kind=kind, invariance_check=f"{pair.config_b} vs {pair.config_a}",
            bitwise_equal=d.equal, mismatched_elements=d.mismatched, max_abs=_finite(d.max_abs),
            max_rel=_finite(d.max_rel),
            accuracy_error=None if acc is None else _finite(acc.error),
            stock_error=None if acc is None else _finite(acc.stock_error),
            accuracy_bound=None if acc is None or acc.accumulation == "baseline" else _finite(acc.bound),
            accuracy_ok=None if acc is None else acc.ok,
            accuracy_class=None if acc is None else acc.accumulation))
        if not d.equal:
            failures.append(f"{name} {kind}_invariance: {pair.describe()}")
        if acc is not None and not acc.ok:
            failures.append(f"{name} {kind}_accuracy: error {acc.error:.3g} > bound {acc.bound:.3g} "
                            f"({acc.accumulation}-class stock {acc.stock_error:.3g})")
    return metrics, failures


def _accuracy(contract: Contract, op: OpSpec, candidate: Candidate, profile: str, name: str, kind: str,
              run: LayoutRun, base_line: OpBaselines, is_baseline: bool) -> AccuracyCheck:
    ref = base_line.reference[name]
    start = base_line.grad_starts.get(name)
    if is_baseline:
        return baseline_accuracy(name, run.tensors[name], ref, start)
    klass = contract.accumulation_class(op.name, name, candidate.family)
    return check_accuracy(contract, op.name, profile, name, kind, klass, run.tensors[name], ref, start,
                          stock_error=base_line.stock_error(name, klass))


def _finite(x: float) -> float:
    """JSON has no inf/NaN: clamp to the largest double so evidence stays canonical JSON."""
    if x != x:
        return _LARGEST
    return min(x, _LARGEST)
