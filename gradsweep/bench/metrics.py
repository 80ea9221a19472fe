"""From timings to the numbers a target names: the phase's time, ratios against every reference, fractions of
the run's ceilings, peak memory, host time. A metric that cannot be computed (a reference absent, a profile
without a kernels figure) is simply not there; a target on it is then 'not measured', never guessed."""

from __future__ import annotations

from gradsweep.bench.cases import Case
from gradsweep.bench.ceilings import Ceilings
from gradsweep.bench.predicate import ImplRecord
from gradsweep.bench.timing import Timing

GIB = float(2**30)


BWD_IN_STEP = "bwd_in_step"  # the kernels figure of a bwd case read inside the training step (backward_mark)


def phase_ms(phase: str, by_mode: dict[str, Timing | None]) -> float | None:
    """The case's phase from its measured modes; ``bwd`` is the backward read inside the training step where the
    timer could (``BWD_IN_STEP``, kernels only), else the training step minus its forward."""
    def med(mode: str) -> float | None:
        t = by_mode.get(mode)
        return None if t is None else t.median_ms

    if phase == "fwd":
        return med("fwd")
    if phase == "fwd_bwd":
        return med("fwd_bwd")
    if med(BWD_IN_STEP) is not None:
        return med(BWD_IN_STEP)
    step, forward = med("fwd_bwd"), med("fwd_train")
    if step is None or forward is None:
        return None
    return step - forward


def settle(record: ImplRecord, phase: str) -> ImplRecord:
    """Fill the record's phase figures from its per-mode timings."""
    return record.model_copy(update={"e2e_ms": phase_ms(phase, dict(record.e2e)),
                                     "kernels_ms": phase_ms(phase, dict(record.kernels)),
                                     "issue_ms": phase_ms(phase, dict(record.issue))})


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0 or a < 0:
        return None
    return a / b


def _kernels_alike(phase: str, mine: ImplRecord, ref: ImplRecord) -> tuple[float | None, float | None]:
    """The two kernels-only phase figures read the same way: where only one side's backward was read inside its
    step, both are taken as the step minus its forward (a ratio never mixes the two readings)."""
    if (BWD_IN_STEP in mine.kernels) == (BWD_IN_STEP in ref.kernels):
        return mine.kernels_ms, ref.kernels_ms

    def derived(rec: ImplRecord) -> float | None:
        return phase_ms(phase, {k: v for k, v in rec.kernels.items() if k != BWD_IN_STEP})
    return derived(mine), derived(ref)


def family_metrics(case: Case, mine: ImplRecord, references: dict[str, ImplRecord],
                   ceilings: Ceilings | None) -> dict[str, float]:
    """Every metric of ``case.metric_names()`` that this run measured for one family."""
    out: dict[str, float | None] = {}
    if case.host_only:
        calls = int(case.extra.get("calls", 1))
        out["host_us"] = None if mine.host is None else mine.host.median_ms * 1e3 / calls
        return {k: v for k, v in out.items() if v is not None}
    for name in case.references():
        ref = references.get(name)
        if ref is None or ref.status != "ok":
            continue
        out[f"e2e_vs_{name}"] = _ratio(mine.e2e_ms, ref.e2e_ms)
        out[f"kernels_vs_{name}"] = _ratio(*_kernels_alike(case.phase, mine, ref))
    out["e2e_vs_kernels"] = _ratio(mine.e2e_ms, mine.kernels_ms)
    out["host_vs_e2e"] = _ratio(mine.issue_ms, mine.e2e_ms)
    traffic, flops = case.traffic_bytes(), case.flop_count()
    if traffic is not None and ceilings is not None:
        out["copy_fraction"] = _ratio(traffic / 1e6, _times(mine.e2e_ms, ceilings.copy_gbps))
        out["copy_fraction_kernels"] = _ratio(traffic / 1e6, _times(mine.kernels_ms, ceilings.copy_gbps))
    if flops is not None and ceilings is not None:
        out["gemm_fraction"] = _ratio(flops / 1e9, _times(mine.e2e_ms, ceilings.gemm_tflops))
    if case.memory and mine.peak_extra_bytes is not None:
        out["peak_extra_gib"] = mine.peak_extra_bytes / GIB
    return {k: float(v) for k, v in out.items() if v is not None}


def _times(ms: float | None, rate: float) -> float | None:
    return None if ms is None or ms <= 0 else ms * rate
