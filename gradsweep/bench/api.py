"""``gradsweep bench`` as a library call: check the inputs, run the suite, write the chart and signed evidence.

Exit codes (``BenchOutcome.exit_code``): 0 the suite ran (targets missed or not); 1 a check failed or a family's or
baseline's run raised; 2 bad usage or input (raised as BadInput before anything runs); 3 nothing can run here:
no CUDA GPU without --quick (``NoDevice``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gradsweep.bench.catalog import QUICK_CHECK_LENGTHS, catalog, default_cases
from gradsweep.bench.ceilings import measure_ceilings
from gradsweep.bench.evidence import is_bench_evidence, read_bench, write_bench_evidence
from gradsweep.bench.measure import run_case
from gradsweep.bench.predicate import (
    BACKWARD_THREADS,
    AnchorRecord,
    BenchPredicate,
    BenchRun,
    BenchVerdict,
    CaseRecord,
    ChartRef,
    Selection,
    Summary,
    TargetsRef,
    backward_text,
)
from gradsweep.bench.suite import select
from gradsweep.bench.targets import DEFAULT_TARGETS, TargetsError, load_targets
from gradsweep.bench.timing import Budget, CudaTimer, HostTimer, Timer
from gradsweep.errors import BadInput, one_line

Say = Callable[[str], None]
EXIT_OK, EXIT_FAIL, EXIT_NO_DEVICE = 0, 1, 3


class NoDevice(Exception):
    """Nothing can run: a full bench needs a CUDA GPU (exit 3)."""


@dataclass
class BenchOptions:
    manifest: Path | None = None
    ops: list[str] | None = None
    families: list[str] | None = None
    out: Path | None = None
    key: Path | None = None
    chart: Path | None = None
    quick: bool = False
    targets: Path | None = None
    force: bool = False
    argv: list[str] = field(default_factory=list)
    timer: Timer | None = None  # tests plant a fake clock
    backward_thread: str = "worker"  # one of BACKWARD_THREADS


@dataclass
class BenchOutcome:
    predicate: BenchPredicate
    out: Path
    chart: Path | None
    exit_code: int


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def _validation_catalog() -> list:
    """Every case a target may name: the catalog's, and the default cases of every op it does not declare."""
    from gradsweep.ops.registry import all_ops

    declared = catalog(False) + catalog(True)
    have = {c.op for c in declared}
    for name, spec in all_ops().items():
        if name not in have:
            declared += default_cases(name, {}, [1], False, spec.differentiable)
    return list({c.id: c for c in declared}.values())


def default_out(manifest_name: str) -> Path:
    return Path("out") / f"{manifest_name}.bench.evidence.json"


def chart_beside(out: Path) -> Path:
    name = out.name.removesuffix(".json").removesuffix(".evidence")
    return out.with_name(f"{name}.png")


def _check_outputs(out: Path, chart: Path, inputs: dict[str, Path | None], manifest_name: str, force: bool) -> None:
    from gradsweep.sweep.outputs import check_not_input, check_writable

    check_writable(out)
    check_writable(chart, flag="--chart")
    check_not_input({"output": out}, inputs)
    check_not_input({"output": chart}, {**inputs, "evidence (-o)": out}, flag="--chart")
    if out.exists() and not force:
        if not is_bench_evidence(out):
            raise BadInput(f"--out {out}: exists and is not bench evidence; pass --force to replace it")
        owner = read_bench(out).manifest.name
        if owner != manifest_name:
            raise BadInput(f"--out {out}: holds bench evidence of manifest {owner!r}, not {manifest_name!r}; pass "
                           "--force to replace it")
    if chart.exists() and not force and chart.suffix.lower() != ".png":
        raise BadInput(f"--chart {chart}: exists and is not a .png; pass --force to replace it")


def _device(quick: bool) -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if not quick:
        raise NoDevice("no CUDA GPU is visible: a bench needs one for figures; --quick runs a CPU smoke of the "
                       "machinery (Triton interpreter, tiny shapes, no figures claimed)")
    return "cpu"


def run_bench(opts: BenchOptions, say: Say = lambda s: None) -> BenchOutcome:
    """Run the bench; BadInput (exit 2) and NoDevice (exit 3) are raised before anything is measured."""
    from gradsweep.evidence.extension import extension_digest, planner_digest
    from gradsweep.evidence.paths import portable_argv, portable_path
    from gradsweep.evidence.predicate import ContractRef, ExtensionRef, ManifestRef, SourceRef
    from gradsweep.evidence.provenance import collect_provenance
    from gradsweep.evidence.signing import KeyFileError, public_path_for, resolve_signer, signing_key_location
    from gradsweep.evidence.source_digest import file_sha256, repo_root, tree_digest
    from gradsweep.evidence.trust import default_trust_file
    from gradsweep.manifest import DEFAULT_MANIFEST, ManifestError, load_manifest

    root = repo_root()
    if opts.backward_thread not in BACKWARD_THREADS:
        raise BadInput(f"--backward-thread {opts.backward_thread!r}: use {' or '.join(BACKWARD_THREADS)}")
    manifest_path = Path(opts.manifest) if opts.manifest is not None else DEFAULT_MANIFEST
    if not manifest_path.exists():
        raise BadInput(f"manifest {manifest_path}: no such file")
    try:
        manifest = load_manifest(manifest_path)
    except ManifestError as exc:
        raise BadInput(one_line(exc)) from None
    targets_path = Path(opts.targets) if opts.targets is not None else DEFAULT_TARGETS
    try:
        targets_file = load_targets(targets_path, _validation_catalog())
    except TargetsError as exc:
        raise BadInput(one_line(exc)) from None
    from gradsweep.contract import ContractError, load_contract

    try:
        contract = load_contract(manifest.contract_path)
    except (ContractError, ValueError) as exc:
        raise BadInput(one_line(exc)) from None
    out = Path(opts.out) if opts.out is not None else default_out(manifest.name)
    chart = Path(opts.chart) if opts.chart is not None else chart_beside(out)
    key_path = signing_key_location(opts.key)
    _check_outputs(out, chart, {"manifest": manifest_path, "targets file": targets_path,
                                "contract": manifest.contract_path, "signing key": key_path,
                                "public key": public_path_for(key_path), "trust file": default_trust_file()},
                   manifest.name, opts.force)
    try:
        signer, _ = resolve_signer(opts.key, say)
    except KeyFileError as exc:
        raise BadInput(one_line(exc)) from None
    device_name = _device(opts.quick)
    selection = select(manifest, opts.ops, opts.families, opts.quick, device_name)
    if not selection.cases:
        raise BadInput("no bench case is selected: check --op and --family")

    import torch

    device = torch.device(device_name)
    timer = opts.timer or (CudaTimer(Budget.quick() if opts.quick else Budget()) if device_name == "cuda"
                           else HostTimer())
    interpreter = _interpreter_on()
    source = tree_digest(root)
    provenance = collect_provenance(root)
    started, clock = now_utc(), time.monotonic()
    say(f"bench {manifest.name}: {len(selection.cases)} cases on {device_name}"
        + (f" ({provenance.gpu_name})" if provenance.gpu_name else "")
        + f", families {', '.join(f'{f} ({p})' for f, p in selection.profiles.items()) or 'none'}"
        + (", --quick: no figures claimed" if opts.quick or device_name != "cuda" else "") + f" -> {out}")
    for profile, why in selection.blocked.items():
        say(f"  profile {profile}: not benched ({why})")
    check_lengths = list(QUICK_CHECK_LENGTHS if opts.quick else manifest.samples.lengths)
    records: list[CaseRecord] = []
    say(f"  {backward_text(opts.backward_thread)}")
    # One engine setting for every side of every case (stock, anchors, families) and for the ceilings' autograd
    # figures: a per-op step makes one backward call, so on the device thread each op pays the hand-off a trainer's
    # step pays once for its whole graph (bench/results/engine_thread_2026-12-04/). The setting is restored
    # afterwards, whatever happens.
    with torch.autograd.set_multithreading_enabled(opts.backward_thread == "worker"):
        ceilings = measure_ceilings(timer, device, opts.quick)
        say(f"  ceilings: copy {ceilings.copy_gbps:.0f} GB/s, cuBLAS bf16 {ceilings.gemm_tflops:.1f} TFLOP/s"
            f"{ceilings.host_text()}")
        for i, case in enumerate(selection.cases, 1):
            say(f"[{i}/{len(selection.cases)}] {case.id}: {case.title}")
            records.append(run_case(case, selection.slots[case.id], timer, device, manifest.seed + i, ceilings,
                                    list(targets_file.targets), manifest.contract_path, check_lengths, say))
    ext, plan = extension_digest(root), planner_digest(root)
    pred = BenchPredicate(
        generator=_generator(),
        manifest=ManifestRef(name=manifest.name, version=int(manifest.manifest_version),
                             path=portable_path(manifest_path, root), sha256=file_sha256(manifest_path)),
        contract=ContractRef(version=str(contract.version), path=portable_path(manifest.contract_path, root),
                             sha256=file_sha256(manifest.contract_path)),
        targets=TargetsRef(path=portable_path(targets_path, root), sha256=file_sha256(targets_path),
                           version=targets_file.version),
        source=SourceRef(sha256=source.sha256, files=source.files, roots=list(source.roots)),
        extension=ExtensionRef.of(ext, root, provenance.cuda_extension),
        planner=ExtensionRef.of(plan, root),
        selection=Selection(ops=opts.ops, families=opts.families, profiles=selection.profiles,
                            blocked=selection.blocked),
        claims_figures=not opts.quick and device_name == "cuda",
        runs=[BenchRun(started_at=started, finished_at=now_utc(), argv=portable_argv(opts.argv, root),
                       quick=opts.quick, device=device_name, interpreter=interpreter, timer=timer.describe(),
                       provenance=provenance, backward_thread=opts.backward_thread)],
        ceilings=ceilings, anchors=_anchors(records), cases=records,
        summary=summarise(records), verdict=BenchVerdict(exit_code=0, summary=""))
    pred = pred.model_copy(update={"verdict": verdict(pred.summary)})
    pred = pred.model_copy(update={"chart": _chart(pred, chart, out, say)})
    write_bench_evidence(out, pred, signer)
    say(f"bench ran {len(records)} cases in {time.monotonic() - clock:.0f} s")
    return BenchOutcome(predicate=pred, out=out, chart=chart if pred.chart.file else None,
                        exit_code=pred.verdict.exit_code)


def _interpreter_on() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def _generator() -> str:
    from gradsweep.sweep.assemble import generator_name

    return generator_name()


def _anchors(records: list[CaseRecord]) -> list[AnchorRecord]:
    from gradsweep.bench.baselines import ANCHORS, anchor_status

    used = {name for r in records for name, ref in r.references.items() if ref.kind == "anchor"}
    out = []
    for name in sorted(used & set(ANCHORS)):
        st = anchor_status(name)
        out.append(AnchorRecord(name=name, installed=st.installed, version=st.version, reason=st.reason))
    return out


def summarise(records: list[CaseRecord]) -> Summary:
    fams = [f for r in records for f in r.families.values()]
    targets = [t for f in fams for t in f.targets]
    checks = [c for f in fams for c in f.checks]
    errors = sum(f.status == "error" for f in fams) + sum(
        ref.status == "error" and ref.kind == "baseline" for r in records for ref in r.references.values())
    return Summary(cases=len(records), rows=len(fams), targets_met=sum(t.met is True for t in targets),
                   targets_missed=sum(t.met is False for t in targets),
                   targets_unmeasured=sum(t.met is None for t in targets),
                   checks_passed=sum(c.passed for c in checks), checks_failed=sum(not c.passed for c in checks),
                   errors=errors)


def verdict(s: Summary) -> BenchVerdict:
    failed = s.checks_failed or s.errors
    text = (f"{s.rows} rows over {s.cases} cases: targets {s.targets_met} met, {s.targets_missed} missed, "
            f"{s.targets_unmeasured} not measured; checks {s.checks_passed} passed, {s.checks_failed} failed; "
            f"{s.errors} errors")
    return BenchVerdict(exit_code=EXIT_FAIL if failed else EXIT_OK, summary=("FAIL: " if failed else "RAN: ") + text)


def _chart(pred: BenchPredicate, chart: Path, out: Path, say: Say) -> ChartRef:
    from gradsweep.evidence.source_digest import file_sha256

    try:
        from gradsweep.bench.chart import draw_chart

        draw_chart(pred, chart)
    except ImportError as exc:
        reason = f"chart skipped: matplotlib is not installed ({exc}); pip install matplotlib"
        say(reason)
        return ChartRef(reason=reason)
    say(f"chart: {chart}")
    beside = chart.parent.resolve() == out.parent.resolve()
    return ChartRef(file=chart.name, sha256=file_sha256(chart),
                    reason="" if beside else "written outside the evidence's directory: verify compares it only "
                                             "when it is moved beside the evidence")
