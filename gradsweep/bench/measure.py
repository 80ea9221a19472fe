"""Run one case: time every reference and every family, check the families' results, evaluate the targets.

A failed check or an exception in a family's or baseline's run is recorded on the case and fails the run (exit
1); nothing is swallowed: the record carries the exception's type and message, and the table shows it. An
anchor (third-party code) that raises is recorded the same way but does not fail the run: it is not ours.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from gradsweep.bench.baselines import Reference, anchor_status
from gradsweep.bench.cases import MEASURED, Case
from gradsweep.bench.catalog import RUNNERS
from gradsweep.bench.ceilings import Ceilings
from gradsweep.bench.checks import contract_check
from gradsweep.bench.metrics import BWD_IN_STEP, family_metrics, settle
from gradsweep.bench.predicate import CaseRecord, CheckRecord, FamilyResult, ImplRecord, TargetResult
from gradsweep.bench.subjects import OpSubject, Subject
from gradsweep.bench.suite import Slot
from gradsweep.bench.targets import Target
from gradsweep.bench.timing import Entry, Timer
from gradsweep.errors import one_line


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {one_line(exc)}"[:500]


@dataclass(frozen=True)
class _Impl:
    """An implementation of a case to time: a reference (baseline, anchor) or a family."""

    label: str
    kind: str
    impl: str | None
    get: Callable[[str], Reference | None]


def _measure_all(impls: list[_Impl], case: Case, timer: Timer) -> dict[str, ImplRecord]:
    """Time every implementation of the case in every mode its phase needs: the end-to-end samples of every
    (implementation, mode) pair in turn, in one ``Timer.e2e_rounds``, then each pair's kernels figure (an
    implementation's modes one after the other) and the peak memory. A ``bwd`` phase is the training step minus its
    forward (``phase_ms``): its two modes are sampled in the same rounds, so a clock or host that drifts over the
    seconds of a case moves both terms of the difference alike (timed mode after mode, dX at M = 4096 read 1.35x
    cuBLAS end to end and 0.76x kernels only on the H200, while the same two steps back to back for 3 s were at
    parity: notes/triton_gemm_vocab.md). An implementation that raises is recorded as an error (or not_applicable
    when it has no path for a mode); the others go on."""
    modes = MEASURED[case.phase]
    records = {i.label: ImplRecord(label=i.label, kind=i.kind, impl=i.impl) for i in impls}  # type: ignore[arg-type]
    figures: dict[str, dict] = {i.label: {"e2e": {}, "kernels": {}, "issue": {}, "peak": None} for i in impls}

    def fail(label: str, exc: BaseException) -> None:
        records[label] = records[label].model_copy(update={"status": "error", "reason": _error(exc)})
        _free()

    refs: dict[str, dict[str, Reference]] = {}
    for i in impls:
        got: dict[str, Reference] = {}
        for mode in modes:
            try:
                ref = i.get(mode)
            except Exception as exc:  # recorded on the case and failing the run (anchors excepted): never hidden
                fail(i.label, exc)
                break
            if ref is None:
                records[i.label] = records[i.label].model_copy(update={
                    "status": "not_applicable", "reason": f"{i.label} has no {mode} path for {case.op}"})
                break
            got[mode] = ref
        if records[i.label].status == "ok":
            refs[i.label] = got
    pairs = {_pair(label, mode): ref for label, by_mode in refs.items() for mode, ref in by_mode.items()}
    timed = timer.e2e_rounds({key: Entry(ref.calls, ref.context) for key, ref in pairs.items()})
    for label, by_mode in refs.items():
        for mode, ref in by_mode.items():
            if records[label].status != "ok":
                break
            got_t = timed[_pair(label, mode)]
            if isinstance(got_t, Exception):
                fail(label, got_t)
                break
            fig = figures[label]
            fig["e2e"][mode] = got_t[0]
            if got_t[1] is not None:
                fig["issue"][mode] = got_t[1]
            try:
                with ref.context():
                    fig["kernels"][mode] = timer.kernels(ref.calls)
                    if case.phase == "bwd" and mode == "fwd_bwd":
                        direct = timer.backward_kernels()
                        if direct is not None:
                            fig["kernels"][BWD_IN_STEP] = direct
                    if case.memory and mode == modes[-1]:
                        fig["peak"] = timer.peak_extra_bytes(ref.calls[0])
            except Exception as exc:
                fail(label, exc)
    del refs, pairs, timed
    for label, rec in records.items():
        if rec.status == "ok":
            fig = figures[label]
            records[label] = settle(rec.model_copy(update={
                "e2e": fig["e2e"], "kernels": fig["kernels"], "issue": fig["issue"], "peak_extra_bytes": fig["peak"]}),
                case.phase)
    return records


def _pair(label: str, mode: str) -> str:
    """The round-robin key of one implementation in one mode."""
    return f"{label} [{mode}]"


def _guarded(label: str, kind: str, impl: str | None, run: Callable[[], ImplRecord]) -> ImplRecord:
    try:
        return run()
    except Exception as exc:  # recorded on the case and failing the run (anchors excepted): never hidden
        _free()
        return ImplRecord(label=label, kind=kind, impl=impl, status="error", reason=_error(exc))  # type: ignore[arg-type]


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _family_impl(subject: Subject, slot: Slot) -> _Impl:
    return _Impl(slot.family, "family", _impl(slot), lambda m: subject.family(slot.family, m))


def _reference_impls(case: Case, subject: Subject) -> tuple[list[_Impl], dict[str, ImplRecord]]:
    """The case's baselines and installed anchors to time, and the absent anchors' records."""
    impls, absent = [], {}
    for name in case.baselines:
        impls.append(_Impl(name, "baseline", None, lambda m, n=name: subject.reference(n, m)))
    for name in case.anchors:
        status = anchor_status(name)
        if not status.installed:
            absent[name] = ImplRecord(label=name, kind="anchor", status="absent", reason=status.reason)
            continue
        impls.append(_Impl(name, "anchor", status.version, lambda m, n=name: subject.reference(n, m)))
    return impls, absent


def _checks(case: Case, subject: Subject, slot: Slot, device: torch.device, contract: Path,
            check_lengths: list[int], op_layouts: tuple[str, ...] | None) -> list[CheckRecord]:
    out = []
    if op_layouts is not None and "bn_chunked" not in op_layouts and case.runner == "op":
        out.append(CheckRecord(name="timed data: split layouts", kind="bitwise", passed=True,
                               detail=f"not applicable: {case.op} runs only whole-sample layouts"))
    else:
        record = subject.bitwise(slot.family)
        if record is not None:
            out.append(record)
    if op_layouts is not None and slot.candidate is not None:
        out.append(contract_check(case.op, slot.candidate, slot.profile, case.check_shape or case.shape,
                                  check_lengths, case.check_layouts, device, contract))
    return out


def _targets(case: Case, family: str, metrics: dict[str, float], targets: list[Target],
             references: dict[str, ImplRecord], status: str, why: str = "") -> list[TargetResult]:
    out = []
    for t in targets:
        if not t.applies(case.op, case.name, family):
            continue
        value = metrics.get(t.metric)
        reason = ""
        if value is None:
            ref = next((r for name, r in references.items() if t.metric.endswith(f"_vs_{name}")), None)
            if why:
                reason = why
            elif ref is not None and ref.status != "ok":
                reason = f"{ref.label} {ref.status}: {ref.reason}"
            else:
                reason = f"the family's run: {status}" if status != "ok" else "no such figure on this box"
        out.append(TargetResult(metric=t.metric, sense=t.sense, bound=t.bound, issue=t.issue, note=t.note,  # type: ignore[arg-type]
                                value=value, met=None if value is None else t.met_by(value), reason=reason))
    return out


def run_case(case: Case, slots: list[Slot], timer: Timer, device: torch.device, seed: int,
             ceilings: Ceilings | None, targets: list[Target], contract: Path, check_lengths: list[int],
             say: Callable[[str], None] = lambda s: None) -> CaseRecord:
    """Every reference and family of one case, then the data is freed."""
    from gradsweep.ops.registry import get_op

    record = CaseRecord(id=case.id, op=case.op, name=case.name, title=case.title, phase=case.phase, grads=case.grads,
                        runner=case.runner, shape=dict(case.shape), lengths=list(case.lengths), tokens=case.tokens,
                        traffic_bytes=case.traffic_bytes(), flops=case.flop_count(), notes=case.notes)
    spec = None if case.op == "fold_plan" else get_op(case.op)
    runnable = {s.family: s.candidate for s in slots if s.candidate is not None}
    families: dict[str, FamilyResult] = {}
    for s in slots:
        if not s.runnable:
            families[s.family] = FamilyResult(profile=s.profile, impl="-", status="blocked", reason=s.reason,
                                              targets=_targets(case, s.family, {}, targets, {}, "blocked", s.reason))
    if not any(s.runnable for s in slots):
        return record.model_copy(update={"families": families})
    try:
        subject: Subject = RUNNERS.get(case.runner, OpSubject)(case, spec, runnable, device, seed)
    except Exception as exc:  # the data or the subject could not be built: every family of the case errors
        _free()
        for s in slots:
            if s.family not in families:
                families[s.family] = FamilyResult(profile=s.profile, impl=_impl(s), status="error", reason=_error(exc))
        return record.model_copy(update={"families": families})
    references: dict[str, ImplRecord] = {}
    measured: dict[str, ImplRecord] = {}
    if not case.host_only:
        ref_impls, absent = _reference_impls(case, subject)
        fam_impls = [_family_impl(subject, s) for s in slots if s.family not in families]
        say(f"  {case.id} [{', '.join(i.label for i in ref_impls + fam_impls)}: end to end in turn]")
        measured = _measure_all(ref_impls + fam_impls, case, timer)
        references = {**{i.label: measured[i.label] for i in ref_impls}, **absent}
        references = {name: references[name] for name in case.references()}  # the case's order
    for s in slots:
        if s.family in families:
            continue
        say(f"  {case.id} [{s.family}]")
        families[s.family] = _family(case, s, subject, timer, device, ceilings, targets, contract, check_lengths,
                                     references, None if spec is None else spec.layouts, measured.get(s.family))
    del subject
    _free()
    return record.model_copy(update={"references": references, "families": families})


def _impl(slot: Slot) -> str:
    if slot.candidate is not None:
        return slot.candidate.impl_id
    return slot.host_impl or "-"


def _family(case: Case, slot: Slot, subject: Subject, timer: Timer, device: torch.device, ceilings: Ceilings | None,
            targets: list[Target], contract: Path, check_lengths: list[int], references: dict[str, ImplRecord],
            op_layouts: tuple[str, ...] | None, measured: ImplRecord | None) -> FamilyResult:
    """Checks, metrics and targets of one family; ``measured``: its timings (None for a host-only case)."""
    impl = _impl(slot)
    if measured is None:
        def host() -> ImplRecord:
            fn, _calls = subject.host_step(slot.family)
            return ImplRecord(label=slot.family, kind="family", impl=impl, host=timer.host(fn))  # type: ignore[arg-type]
        measured = _guarded(slot.family, "family", impl, host)
    checks: list[CheckRecord] = []
    status, reason = "ok", ""
    if measured.status == "error":
        status, reason = "error", measured.reason
    else:
        try:
            checks = _checks(case, subject, slot, device, contract, check_lengths, op_layouts)
        except Exception as exc:  # a check that cannot run fails the run like a failed check
            status, reason = "error", f"check crashed: {_error(exc)}"
            _free()
        failed = [c for c in checks if not c.passed]
        if failed and status == "ok":
            status, reason = "check_failed", f"{failed[0].name}: {failed[0].detail}"
    metrics = family_metrics(case, measured, references, ceilings) if measured.status == "ok" else {}
    return FamilyResult(profile=slot.profile, impl=impl, status=status, reason=reason, measured=measured,  # type: ignore[arg-type]
                        metrics=metrics, checks=checks,
                        targets=_targets(case, slot.family, metrics, targets, references, status))

