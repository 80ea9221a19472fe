"""The bench predicate (``https://gradsweep.dev/bench/v1``): what a bench run measured, on what, against what.

Typed so that ``report`` and ``verify`` read exactly what ``bench`` wrote. Subjects and provenance are the
sweep evidence's (manifest file, source tree; GPU, CPU, BLAS, git), plus the digests of the targets file, the
contract and the built extension, so ``verify`` can say when the figures are about another checkout.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gradsweep.bench.ceilings import Ceilings
from gradsweep.bench.timing import Timing
from gradsweep.evidence.predicate import ContractRef, ExtensionRef, ManifestRef, SourceRef
from gradsweep.evidence.provenance import Provenance

BENCH_PREDICATE = "https://gradsweep.dev/bench/v1"
CaseStatus = Literal["ok", "check_failed", "error", "blocked"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TargetsRef(_Strict):
    path: str
    sha256: str
    version: int


BACKWARD_THREADS = {  # BenchRun.backward_thread: where the timed backwards ran, in words
    "worker": "the autograd engine's device thread (torch's default)",
    "caller": "the calling thread (torch.autograd.set_multithreading_enabled(False))",
}


def backward_text(thread: str) -> str:
    """Where the run's backwards ran (every side alike), in words."""
    return f"backwards on {BACKWARD_THREADS.get(thread, thread)}"


class BenchRun(_Strict):
    """The invocation (``runs`` is a one-element list, the shape sweep evidence has, so readers share code)."""

    started_at: str
    finished_at: str
    argv: list[str]
    quick: bool
    device: str = Field(description="cuda, or cpu (the --quick smoke under the Triton interpreter)")
    interpreter: bool = Field(description="Triton ran under TRITON_INTERPRET=1")
    timer: dict[str, Any]
    provenance: Provenance
    backward_thread: Literal["worker", "caller"] = Field(
        "worker", description="where the autograd engine ran the timed backwards: its device thread (worker, torch's "
        "default; every file from before this field) or the calling thread (caller: "
        "torch.autograd.set_multithreading_enabled(False)); every side of the run alike")


class Selection(_Strict):
    ops: list[str] | None = None
    families: list[str] | None = None
    profiles: dict[str, str] = Field(default_factory=dict, description="family -> profile of the manifest")
    blocked: dict[str, str] = Field(default_factory=dict, description="profile -> why it could not run here")


class AnchorRecord(_Strict):
    name: str
    installed: bool
    version: str | None = None
    reason: str = ""


class ImplRecord(_Strict):
    """One implementation of one case: timings per measured mode and what they give for the case's phase."""

    label: str
    kind: Literal["family", "baseline", "anchor"]
    impl: str | None = None
    status: Literal["ok", "absent", "not_applicable", "error"] = "ok"
    reason: str = ""
    e2e: dict[str, Timing] = Field(default_factory=dict, description="by measured mode: fwd, fwd_train, fwd_bwd")
    kernels: dict[str, Timing | None] = Field(default_factory=dict, description=(
        "by measured mode; a bwd case's fwd_bwd round also gives bwd_in_step (schema 4): the backward's device "
        "time read inside the profiled steps (bench/backward_mark.py), which kernels_ms then is; without it, "
        "kernels_ms is fwd_bwd - fwd_train"))
    host: Timing | None = None
    issue: dict[str, Timing] = Field(default_factory=dict, description=(
        "by measured mode: host time per call spent issuing the e2e samples' calls (no synchronisation inside "
        "a sample); close to e2e: the step is host-bound"))
    peak_extra_bytes: int | None = None
    e2e_ms: float | None = Field(None, description="the case's phase end to end (bwd: fwd_bwd - fwd_train)")
    kernels_ms: float | None = None
    issue_ms: float | None = Field(None, description="the case's phase as host issue time (as e2e_ms)")


class CheckRecord(_Strict):
    name: str
    kind: Literal["bitwise", "contract"]
    passed: bool
    detail: str


class TargetResult(_Strict):
    metric: str
    sense: Literal["max", "min"]
    bound: float
    issue: str
    note: str = ""
    value: float | None = None
    met: bool | None = Field(None, description="None: not measured here (the reason says why)")
    reason: str = ""


class FamilyResult(_Strict):
    profile: str
    impl: str
    status: CaseStatus
    reason: str = ""
    measured: ImplRecord | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    checks: list[CheckRecord] = Field(default_factory=list)
    targets: list[TargetResult] = Field(default_factory=list)


class CaseRecord(_Strict):
    id: str
    op: str
    name: str
    title: str
    phase: str
    grads: str
    runner: str
    shape: dict[str, Any]
    lengths: list[int]
    tokens: int
    traffic_bytes: float | None = None
    flops: float | None = None
    notes: str = ""
    references: dict[str, ImplRecord] = Field(default_factory=dict)
    families: dict[str, FamilyResult] = Field(default_factory=dict)


class ChartRef(_Strict):
    file: str | None = None
    sha256: str | None = None
    reason: str = ""


class Summary(_Strict):
    cases: int
    rows: int
    targets_met: int
    targets_missed: int
    targets_unmeasured: int
    checks_passed: int
    checks_failed: int
    errors: int


class BenchVerdict(_Strict):
    exit_code: int
    summary: str


class BenchPredicate(_Strict):
    schema_version: Literal[1, 2, 3, 4] = 4  # 2: host issue times (ImplRecord.issue, issue_ms; metric host_vs_e2e);
    # 3: BenchRun.backward_thread; 4: ImplRecord.kernels["bwd_in_step"] (a bwd case's backward read inside its step)
    generator: str
    manifest: ManifestRef
    contract: ContractRef
    targets: TargetsRef
    source: SourceRef
    extension: ExtensionRef | None = None
    planner: ExtensionRef | None = Field(None, description="the compiled fold planner the timed folds planned with "
                                         "(None: numpy, or evidence from before it)")
    selection: Selection
    claims_figures: bool = Field(description="false for --quick and CPU runs: machinery exercised, no figures")
    runs: list[BenchRun]
    ceilings: Ceilings | None = None
    anchors: list[AnchorRecord] = Field(default_factory=list)
    cases: list[CaseRecord]
    chart: ChartRef = Field(default_factory=ChartRef)
    summary: Summary
    verdict: BenchVerdict
