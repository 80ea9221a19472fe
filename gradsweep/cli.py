"""The ``gradsweep`` command line: a thin Typer layer over gradsweep.sweep, .evidence and .report.

Run as ``gradsweep ...`` (console script) or ``python -m gradsweep.cli ...``. Every user error is
one ``gradsweep: error: ...`` line on stderr with a documented exit code, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console

from gradsweep.errors import BadInput, one_line
from gradsweep.resolve import DEFAULT_CELL_FN, DEFAULT_LOADER
from gradsweep.sweep.tally import EXIT_FAIL, EXIT_USAGE

if TYPE_CHECKING:
    from gradsweep.bench.suite import EnvTooLate

EXIT_STALE = 4
EXIT_VERDICT = 5
EXIT_INTERRUPTED = 130
WIDE = 10_000  # a console that is not a terminal never truncates a table

EXIT_CODES_HELP = """
Exit codes of sweep, merge and check: 0 every non-skipped cell green or blocked (tracked reds allowed);
1 an untracked red or an error (with --strict also a blocked cell or a stale tracked entry);
2 bad usage, manifest or input (one line on stderr, nothing written); 3 nothing could run (every cell
blocked or skipped); 130 interrupted (partial results kept for --resume).
verify: 0 valid and fresh; 1 bad signature, untrusted key or malformed evidence; 2 bad usage;
4 valid but stale: an input of the verdicts (source tree, manifest, contract, tracked reds, built
extension, compiled fold planner) differs from this checkout (0 with --allow-stale); 5 with --require-pass:
valid, but the sweep's own verdict was not PASS (its exit code was not 0).
report and diff: 1 when the evidence does not verify (unless --allow-unverified); diff: 1 on a regression
or lost coverage. bench: 0 it ran (targets met or missed); 1 a check failed or a case raised; 2 bad usage or
input; 3 no CUDA GPU without --quick. Any command: 1 on an unexpected internal error (one line;
GRADSWEEP_DEBUG=1 shows the traceback).
"""


def _version() -> str:
    from gradsweep.sweep.assemble import generator_name

    return generator_name()


class _App(typer.Typer):
    """The Typer app, with unexpected exceptions turned into one line (GRADSWEEP_DEBUG=1 re-raises)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if os.environ.get("GRADSWEEP_DEBUG"):
                raise
            sys.stderr.write(f"gradsweep: error: internal error: {type(exc).__name__}: {one_line(exc)} "
                             "(GRADSWEEP_DEBUG=1 shows the traceback)\n")
            sys.exit(EXIT_FAIL)


app = _App(name="gradsweep", no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
           rich_markup_mode=None,  # plain click help: readable metavars, never truncated
           help="Prove LLM kernels batch-invariant and accurate, cell by cell, as signed evidence.\n\n"
                + EXIT_CODES_HELP)


def make_console(file: Any = None, stderr: bool = False) -> Console:
    """A terminal console, or a wide plain one for pipes and files (tables are never truncated)."""
    target = file if file is not None else (sys.stderr if stderr else sys.stdout)
    if target.isatty():
        return Console(file=file, stderr=stderr, highlight=False, soft_wrap=True)
    return Console(file=file, stderr=stderr, highlight=False, soft_wrap=True, width=WIDE, color_system=None)


class _LazyConsole:
    """Resolve the console at use, so a redirected stdout (tests, pipes) is seen as it is then."""

    def __init__(self, stderr: bool):
        self.stderr = stderr

    def __getattr__(self, name: str) -> Any:
        return getattr(make_console(stderr=self.stderr), name)


out_console: Any = _LazyConsole(stderr=False)
err_console: Any = _LazyConsole(stderr=True)


def say(message: str) -> None:
    err_console.print(message, markup=False)


def fail(message: object, code: int = EXIT_USAGE) -> NoReturn:
    """One line on stderr naming the problem, then exit."""
    sys.stderr.write(f"gradsweep: error: {one_line(message)}\n")
    raise typer.Exit(code)


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(_version() + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """Prove LLM kernels batch-invariant and accurate, cell by cell, as signed evidence."""


# Options shared by several commands: one spelling, one metavar, one help text each.
CellFnOpt = Annotated[str, typer.Option("--cell-fn", envvar="GRADSWEEP_CELL_FN", hidden=True,
                                        help="module:function run for each cell (tests plant fakes; recorded "
                                             "and flagged by verify and report)")]
LoaderOpt = Annotated[str, typer.Option("--manifest-loader", envvar="GRADSWEEP_MANIFEST_LOADER", hidden=True,
                                        help="module:function that loads a manifest (tests plant fakes; "
                                             "recorded and flagged)")]
TreeOpt = Annotated[Path | None, typer.Option("--tree", hidden=True, metavar="DIR",
                                              help="checkout to digest and compare (default: this one)")]
TrustedOpt = Annotated[list[Path] | None, typer.Option(
    "--trusted-key", metavar="PUB", help="ad-hoc override: trust exactly this public key (PEM, repeatable) for "
                                         "any manifest instead of the trust file")]
TrustFileOpt = Annotated[Path | None, typer.Option(
    "--trust-file", metavar="YAML", help="trust file (default: evidence/trust.yaml of this checkout)")]
AllowUnverifiedOpt = Annotated[bool, typer.Option(
    "--allow-unverified", help="read evidence whose signature does not verify, under an UNVERIFIED banner")]
AllowPluginsOpt = Annotated[bool, typer.Option(
    "--allow-plugins", help="import the plugin modules the manifest names (code; refused without this flag)")]
RerunsOpt = Annotated[int | None, typer.Option(
    "--reruns", metavar="N", help="re-run the reference layout N times to detect nondeterminism "
                                  "(default: the manifest's reruns, else 1)")]
StrictOpt = Annotated[bool, typer.Option("--strict", help="blocked cells and stale tracked entries fail")]
KeyOpt = Annotated[Path | None, typer.Option(
    "--key", metavar="PEM", help="Ed25519 signing key; default $GRADSWEEP_KEY, else "
                                 "~/.config/gradsweep/signing-key.pem (created on first use)")]
ManifestOpt = Annotated[Path | None, typer.Option("--manifest", metavar="YAML",
                                                  help="manifest (default: manifests/default.yaml)")]
Names = list[str] | None
OptPath = Path | None


@app.command()
def sweep(
    manifest: Annotated[OptPath, typer.Argument(
        metavar="MANIFEST", help="manifest YAML (default: manifests/default.yaml)")] = None,
    op: Annotated[Names, typer.Option("--op", metavar="NAME", help="only this op (repeatable)")] = None,
    profile: Annotated[Names, typer.Option("--profile", metavar="NAME", help="only this profile (repeatable)")]
    = None,
    layout: Annotated[Names, typer.Option("--layout", metavar="NAME", help="only this layout (repeatable)")]
    = None,
    shard: Annotated[str | None, typer.Option("--shard", metavar="K/N",
                                              help="run shard K of N (1-based) of the sorted cells")] = None,
    out: Annotated[OptPath, typer.Option(
        "--out", "-o", metavar="FILE", help="evidence file (default: out/<manifest name>[.shard-K-of-N]"
                                            ".evidence.json); the test result goes beside it")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue from <out>.partial.jsonl of an "
                                                          "interrupted run")] = False,
    force: Annotated[bool, typer.Option("--force", help="replace an --out that holds evidence of another "
                                                        "manifest, or is not evidence")] = False,
    strict: StrictOpt = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", metavar="N",
                                             help="parallel workers (default: one per GPU for the GPU "
                                                  "profiles, plus min(2, CPUs) for CPU profiles; a GPU is "
                                                  "never shared)")] = None,
    cell_timeout: Annotated[float | None, typer.Option("--cell-timeout", metavar="SECONDS",
                                                       help="per-cell limit (default: manifest, else 900)")]
    = None,
    reruns: RerunsOpt = None,
    key: KeyOpt = None,
    tracked: Annotated[OptPath, typer.Option("--tracked", metavar="YAML", help="tracked reds file (default: "
                                             "tracked_reds.yaml beside the manifest)")] = None,
    allow_plugins: AllowPluginsOpt = False,
    progress: Annotated[bool | None, typer.Option("--progress/--no-progress",
                                                  help="progress bar (default: if stderr is a terminal)")]
    = None,
    cell_fn: CellFnOpt = DEFAULT_CELL_FN,
    loader: LoaderOpt = DEFAULT_LOADER,
    tree: TreeOpt = None,
) -> None:
    """Run the cells isolated, print the matrix, write signed evidence.

    Every op x profile x layout cell of the manifest runs in a worker process (a GPU profile's workers each
    hold one GPU of their own); the evidence and its in-toto test result are signed with --key.
    """
    from gradsweep.sweep.api import SweepOptions, execute_sweep, prepare_sweep
    from gradsweep.sweep.progress import SweepProgress

    opts = SweepOptions(manifest=manifest, ops=op, profiles=profile, layouts=layout, shard=shard, out=out,
                        resume=resume, force=force, strict=strict, jobs=jobs, cell_timeout=cell_timeout,
                        reruns=reruns, key=key, tracked=tracked, allow_plugins=allow_plugins, cell_fn=cell_fn,
                        loader=loader, tree=tree, argv=list(sys.argv))
    try:
        plan = prepare_sweep(opts, say)
    except BadInput as exc:
        fail(exc)
    placed = f", one per GPU ({', '.join(plan.gpus)})" if plan.placed else ""
    say(f"sweep {plan.info.name}: {len(plan.cells)} cells"
        + (f" (shard {plan.shard.spec})" if plan.shard else "")
        + f", {plan.jobs} worker(s){placed}, {plan.timeout_s:g} s per cell, reruns {plan.reruns} -> {plan.out}")
    errors = make_console(stderr=True)
    show_bar = progress if progress is not None else errors.is_terminal
    started = time.monotonic()
    with SweepProgress(errors, total=len(plan.cells), done=plan.kept, bar=show_bar) as bar:
        try:
            outcome = execute_sweep(plan, on_result=bar.update)
        except KeyboardInterrupt:
            bar.stop()
            say(f"interrupted: finished cells are kept in {plan.partial.path}; rerun with --resume")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    from gradsweep.evidence.custom_code import custom_code_warnings
    from gradsweep.report.table import render_report

    render_report(outcome.predicate, make_console(), banners=custom_code_warnings(outcome.predicate))
    say(f"swept {len(plan.remaining)} cell(s) in {time.monotonic() - started:.0f} s with {plan.jobs} worker(s)\n"
        f"evidence: {outcome.out}, test result: {outcome.result_statement}\n"
        f"verify: {_verify_hint(outcome.out, key)}")
    raise typer.Exit(outcome.exit_code)


def _verify_hint(evidence: Path, key: Path | None) -> str:
    """The verify command for fresh evidence: the trust file, or the signing key's public half ad hoc."""
    from gradsweep.evidence.signing import public_path_for, signing_key_location

    pub = public_path_for(signing_key_location(key))
    return f"gradsweep verify {evidence} --trusted-key {pub}  (or add the key to evidence/trust.yaml)"


class Format(str, Enum):
    table = "table"
    md = "md"
    junit = "junit"


def _check_report_out(output: Path, evidence: Path) -> None:
    from gradsweep.bench.evidence import is_bench_evidence
    from gradsweep.sweep.outputs import check_not_evidence, check_not_input, check_writable

    check_writable(output, make_dirs=False)
    check_not_input({"output": output}, {"evidence": evidence})
    check_not_evidence(output)
    if is_bench_evidence(output):
        raise BadInput(f"--out {output}: is bench evidence; a report never replaces evidence, choose another path")


@app.command()
def report(
    evidence: Annotated[Path, typer.Argument(metavar="EVIDENCE", help="evidence file")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, md (CI step summary) or junit")]
    = Format.table,
    out: Annotated[OptPath, typer.Option("--out", "-o", metavar="FILE", help="write here instead of stdout")]
    = None,
    trusted_key: TrustedOpt = None,
    trust_file: TrustFileOpt = None,
    allow_unverified: AllowUnverifiedOpt = False,
) -> None:
    """Verify, then render evidence as a table, markdown or JUnit.

    The signature is checked against the trust file (or --trusted-key) first; unverifiable evidence is
    refused unless --allow-unverified, which marks every rendering UNVERIFIED.
    """
    from io import StringIO

    from gradsweep.bench.evidence import is_bench_evidence
    from gradsweep.evidence.envelope import write_atomic
    from gradsweep.evidence.verify import EvidenceError

    _need_file(evidence)
    if out is not None:
        try:
            _check_report_out(out, evidence)
        except BadInput as exc:
            fail(exc)
    if is_bench_evidence(evidence):
        from gradsweep.report.bench import open_bench, render_bench, render_bench_junit, render_bench_markdown

        opener, table, markdown, junit = open_bench, render_bench, render_bench_markdown, render_bench_junit
    else:
        from gradsweep.report.junit import render_junit
        from gradsweep.report.markdown import render_markdown
        from gradsweep.report.readers import open_evidence
        from gradsweep.report.table import render_report

        def table(pred, console, banners, note):
            render_report(pred, console, max_problems=10_000, banners=banners, note=note)

        opener, markdown, junit = open_evidence, render_markdown, render_junit
    try:
        opened = opener(evidence, trusted_key, trust_file, allow_unverified)
    except EvidenceError as exc:
        fail(exc, EXIT_FAIL)
    for banner in opened.banners:
        say(f"WARNING: {banner}")
    pred, banners, note = opened.predicate, opened.banners, opened.note()
    if fmt is Format.table:
        buffer = StringIO() if out is not None else None
        table(pred, make_console(buffer) if buffer is not None else make_console(), banners=banners, note=note)
        text = buffer.getvalue() if buffer is not None else None
    elif fmt is Format.md:
        text = markdown(pred, banners=banners, note=note)
    else:
        text = junit(pred, banners=banners)
    if text is None:
        return
    if out is None:
        sys.stdout.write(text)
        return
    try:
        write_atomic(out, text.encode())
    except OSError as exc:
        fail(f"--out {out}: cannot write ({exc.strerror})")


def _need_file(path: Path, what: str = "evidence") -> None:
    """A missing input file is bad usage (exit 2), not a bad signature."""
    if path.is_dir():
        fail(f"{what} {path}: is a directory; give a file")
    if not path.is_file():
        fail(f"{what} {path}: no such file")


def _signers(trusted_key: list[Path] | None, trust_file: Path | None) -> list:
    from gradsweep.evidence.trust import TrustError, resolve_signers

    try:
        return resolve_signers(trusted_key, trust_file)
    except TrustError as exc:
        fail(exc)


@app.command()
def verify(
    evidence: Annotated[Path, typer.Argument(metavar="EVIDENCE", help="evidence file")],
    trusted_key: TrustedOpt = None,
    trust_file: TrustFileOpt = None,
    allow_stale: Annotated[bool, typer.Option("--allow-stale", help="exit 0 even if an input of the verdicts "
                                                                    "changed since the run")] = False,
    allow_other_build: Annotated[bool, typer.Option(
        "--allow-other-build", help="accept built modules that differ from the run's (re-verifying on another "
                                    "machine that built its own gradsweep/_C and gradsweep/_fold_plan); sources "
                                    "are still compared")] = False,
    tree: TreeOpt = None,
    require_pass: Annotated[bool, typer.Option(
        "--require-pass", help="also exit 5 when the sweep evidence's own verdict is not PASS (a release script "
                               "that must refuse a signed FAIL; verify alone judges trust, not the verdict)")] = False,
) -> None:
    """Check the signature, the signer and freshness.

    The signer must be in the trust file (or given with --trusted-key) and allowed to sign the manifest;
    then the source tree, manifest, contract, tracked reds, built extension and compiled fold planner are
    compared with this checkout.
    """
    from gradsweep.evidence.custom_code import custom_code_warnings
    from gradsweep.evidence.freshness import BUILDS, stale_checks
    from gradsweep.evidence.verify import EvidenceError
    from gradsweep.report.readers import verify_any_evidence

    _need_file(evidence)
    signers = _signers(trusted_key, trust_file)
    from gradsweep.drift.evidence import is_drift_evidence

    if is_drift_evidence(evidence):
        if require_pass:
            _require_pass("drift", None)
        _verify_drift(evidence, signers, tree, allow_stale)
        return
    try:
        result = verify_any_evidence(evidence, signers, tree)
    except EvidenceError as exc:
        fail(exc, EXIT_FAIL)
    pred = result.predicate
    prov = pred.runs[0].provenance if pred.runs else None
    console = make_console()
    console.print(f"signature OK: {evidence} signed by "
                  + "; ".join(s.describe() for s in result.signers), markup=False)
    if result.kind == "bench":
        from gradsweep.report.bench import verify_summary

        for line in verify_summary(pred):
            console.print(line, markup=False)
    else:
        console.print(f"manifest {pred.manifest.name} v{pred.manifest.version} ({pred.manifest.path}), "
                      f"contract {pred.contract.version}; {pred.verdict.summary}", markup=False)
        if prov is not None:
            console.print(f"ran {pred.runs[0].started_at} on {prov.host}: {prov.gpu_name or 'no GPU'}"
                          f"{' ' + prov.sm if prov.sm else ''}, torch {prov.torch}, git {prov.git_commit or 'n/a'}"
                          f"{' (dirty)' if prov.git_dirty else ''}", markup=False)
        console.print("test result: " + (f"{result.result_statement} (in-toto test-result v0.1 beside it, same "
                                          "signer and subjects)" if result.result_statement else
                                          "none beside the evidence"), markup=False)
    for check in result.checks:
        console.print(f"  {check.line()}", markup=False)
    for warning in custom_code_warnings(pred) if result.kind == "closeout" else []:
        say(f"WARNING: {warning}")
    stale = stale_checks(result.checks, allow_other_build)
    if stale:
        hint = "; on another machine with its own build, --allow-other-build accepts the builds only" \
            if all(c.name in BUILDS for c in stale) else f"; rerun the {result.kind.replace('closeout', 'sweep')}"
        say("STALE: " + "; ".join(c.line() for c in stale) + hint)
        if not allow_stale:
            raise typer.Exit(EXIT_STALE)
    else:
        console.print("fresh: every input of the verdicts matches this checkout", markup=False)
    if require_pass:
        _require_pass(result.kind, pred)


def _require_pass(kind: str, pred: Any) -> None:
    """``verify --require-pass``: exit 5 unless sweep evidence records the exit code 0 (PASS)."""
    if kind != "closeout":
        fail(f"--require-pass: {kind} evidence has no sweep verdict; drop --require-pass for it", EXIT_USAGE)
    if pred.verdict.exit_code != 0:
        say(f"VERDICT NOT PASS: the sweep exited {pred.verdict.exit_code}: {pred.verdict.summary}")
        raise typer.Exit(EXIT_VERDICT)


def _verify_drift(evidence: Path, signers: list, tree: Path | None, allow_stale: bool) -> None:
    """``verify`` of drift evidence: signature, signer, artifacts beside it, then the source tree and manifest."""
    from gradsweep.drift.evidence import DriftEvidenceError, drift_input_checks, verify_drift
    from gradsweep.evidence.source_digest import repo_root

    try:
        pred = verify_drift(evidence, signers)
    except DriftEvidenceError as exc:
        fail(exc, EXIT_FAIL)
    report = pred["report"]
    prov = pred.get("provenance") or {}
    console = make_console()
    console.print(f"signature OK: {evidence} (drift evidence; artifacts beside it unchanged)", markup=False)
    console.print(f"drift of manifest {report['manifest'].get('name')} ({report['manifest'].get('path')}): "
                  f"{len(report.get('pairs', []))} pair(s) on {report.get('device')}; ran on "
                  f"{prov.get('gpu_name') or 'no GPU'}, torch {prov.get('torch')}", markup=False)
    for pair in report.get("pairs", []):
        first, status = pair.get("first_difference"), pair.get("status", "not run")
        what = f"first difference at {first}" if first else \
            "bit-identical at every boundary" if status == "compared" else status
        console.print(f"  {pair['id']} ({pair.get('claim')}): {what}", markup=False)
    checks = drift_input_checks(pred, (tree or repo_root()).resolve())
    for check in checks:
        console.print(f"  {check.line()}", markup=False)
    stale = [c for c in checks if c.stale]
    if stale:
        say("STALE: " + "; ".join(c.line() for c in stale) + "; rerun the drift")
        raise typer.Exit(0 if allow_stale else EXIT_STALE)
    console.print("fresh: every input of the drift matches this checkout", markup=False)


@app.command()
def bench(
    manifest: Annotated[OptPath, typer.Argument(
        metavar="MANIFEST", help="manifest YAML (default: manifests/default.yaml)")] = None,
    op: Annotated[Names, typer.Option("--op", metavar="NAME", help="only this op (repeatable)")] = None,
    family: Annotated[Names, typer.Option("--family", metavar="NAME", help="only this family: triton, cuda or "
                                          "host (repeatable)")] = None,
    out: Annotated[OptPath, typer.Option(
        "--out", "-o", metavar="FILE", help="bench evidence (default: out/<manifest name>.bench.evidence.json)")]
    = None,
    key: KeyOpt = None,
    chart: Annotated[OptPath, typer.Option("--chart", metavar="PNG", help="PNG chart (default: beside the "
                                           "evidence, <name>.bench.png)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="tiny shapes and short timing (no figures claimed); the "
                                        "only mode on a box without a CUDA GPU: a CPU smoke under the Triton "
                                        "interpreter")] = False,
    targets: Annotated[OptPath, typer.Option("--targets", metavar="YAML", help="targets file (default: "
                                             "manifests/bench_targets.yaml)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an --out that is not bench evidence of this "
                                                        "manifest")] = False,
    backward_thread: Annotated[str, typer.Option(
        "--backward-thread", metavar="worker|caller",
        help="where the timed backwards run, for every side alike: worker = the autograd engine's device thread "
             "(torch's default), caller = the calling thread (torch.autograd.set_multithreading_enabled(False)); "
             "recorded in the evidence")] = "worker",
) -> None:
    """Time every op of the manifest end to end and kernels only, next to the stock path, the installed anchors
    and the run's own ceilings; print the ratios, write signed bench evidence and a PNG chart.

    Every timed kernel's result is checked (bitwise on the timed data, accuracy and invariance through the
    contract's judge); targets come from manifests/bench_targets.yaml. Exit 0 when it ran, targets met or not.
    """
    from gradsweep.bench.api import EXIT_NO_DEVICE, BenchOptions, NoDevice, run_bench
    from gradsweep.bench.suite import EnvTooLate
    from gradsweep.report.bench import render_bench

    opts = BenchOptions(manifest=manifest, ops=op, families=family, out=out, key=key, chart=chart, quick=quick,
                        targets=targets, force=force, argv=list(sys.argv), backward_thread=backward_thread)
    try:
        outcome = run_bench(opts, say)
    except EnvTooLate as exc:
        _rerun_with(exc)
    except BadInput as exc:
        fail(exc)
    except NoDevice as exc:
        fail(exc, EXIT_NO_DEVICE)
    except KeyboardInterrupt:
        say("interrupted: no bench evidence written")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    render_bench(outcome.predicate, make_console())
    say(f"evidence: {outcome.out}" + (f", chart: {outcome.chart}" if outcome.chart else "")
        + f"\nverify: {_verify_hint(outcome.out, key)}")
    raise typer.Exit(outcome.exit_code)


_RERUN_MARK = "GRADSWEEP_BENCH_RERUN"


def _rerun_with(exc: EnvTooLate) -> NoReturn:
    """Run this same command once more in a fresh process with the profiles' env set from its start (Triton reads
    its switches at import, which already happened here); a rerun that meets the same refusal fails with it."""
    import subprocess

    if os.environ.get(_RERUN_MARK) == "1" or "bench" not in sys.argv[1:]:  # not run as a command line
        fail(exc)
    sets = " ".join(f"{k}={v}" for k, v in exc.env.items())
    say(f"re-running in a fresh process with {sets} set from its start (Triton reads it when it is imported)")
    env = {**os.environ, **exc.env, _RERUN_MARK: "1"}
    code = subprocess.call([sys.executable, "-m", "gradsweep.cli", *sys.argv[1:]], env=env)
    raise typer.Exit(code)


@app.command()
def merge(
    shards: Annotated[list[Path], typer.Argument(metavar="SHARD", help="shard evidence files")],
    out: Annotated[Path, typer.Option("--out", "-o", metavar="FILE", help="merged evidence file")],
    trusted_key: TrustedOpt = None,
    trust_file: TrustFileOpt = None,
    key: KeyOpt = None,
    strict: StrictOpt = False,
    force: Annotated[bool, typer.Option("--force", help="replace an --out that holds evidence of another "
                                                        "manifest, or is not evidence")] = False,
) -> None:
    """Merge shard evidence into one signed evidence.

    Every shard K/N must be present once, verify, and come from the same manifest, tree, contract, filters,
    tracked reds and extension build.
    """
    from gradsweep.evidence.signing import KeyFileError, resolve_signer, signing_key_location
    from gradsweep.report.table import render_report
    from gradsweep.sweep.merge import merge_shards

    for shard in shards:
        _need_file(shard, "shard")
    signers = _signers(trusted_key, trust_file)
    try:
        signer, _ = resolve_signer(key, say)
        merged = merge_shards(shards, signers, signer, out, strict=strict, force=force,
                              key_path=signing_key_location(key))
    except (BadInput, KeyFileError) as exc:
        fail(exc)
    render_report(merged, make_console())
    say(f"merged evidence: {out}\nverify: {_verify_hint(out, key)}")
    raise typer.Exit(merged.verdict.exit_code)


@app.command()
def diff(
    old: Annotated[Path, typer.Argument(metavar="OLD", help="earlier evidence")],
    new: Annotated[Path, typer.Argument(metavar="NEW", help="later evidence")],
    trusted_key: TrustedOpt = None,
    trust_file: TrustFileOpt = None,
    allow_unverified: AllowUnverifiedOpt = False,
) -> None:
    """Status changes between two evidence files.

    Both are verified first; regressions are listed first, and a regression (a new red or error) or lost
    coverage (a cell that ran and no longer does) exits 1.
    """
    from gradsweep.evidence.verify import EvidenceError
    from gradsweep.report.diff import diff_predicates, failing, render_diff
    from gradsweep.report.readers import open_evidence

    _need_file(old)
    _need_file(new)
    try:
        before = open_evidence(old, trusted_key, trust_file, allow_unverified)
        after = open_evidence(new, trusted_key, trust_file, allow_unverified)
    except EvidenceError as exc:
        fail(exc, EXIT_FAIL)
    console = make_console()
    for banner in dict.fromkeys(before.banners + after.banners):
        say(f"WARNING: {banner}")
        console.print(f"WARNING: {banner}", markup=False)
    if before.predicate.manifest.name != after.predicate.manifest.name:
        say(f"note: comparing evidence of manifest {before.predicate.manifest.name!r} with "
            f"{after.predicate.manifest.name!r}")
    changes = diff_predicates(before.predicate, after.predicate)
    console.print(render_diff(changes), markup=False)
    raise typer.Exit(EXIT_FAIL if failing(changes) else 0)


@app.command()
def keygen(
    out: Annotated[Path | None, typer.Option("--out", "-o", metavar="PEM", help="private key path "
                                             "(default ~/.config/gradsweep/signing-key.pem)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing key, or write inside a "
                                                        "repository (the path must be git-ignored)")] = False,
) -> None:
    """Write an Ed25519 signing keypair.

    The private key is written 0600 (never inside a repository without --force), the public key beside it
    as <name>.pub.pem; the trust-file entry to paste into evidence/trust.yaml is printed.
    """
    from gradsweep.evidence.signing import (
        KeyFileError,
        default_key_path,
        public_path_for,
        refuse_key_in_repository,
        write_keypair,
    )

    path = out or default_key_path()
    try:
        if not force:
            refuse_key_in_repository(path)
        signer = write_keypair(path, overwrite=force)
    except KeyFileError as exc:
        fail(exc)
    stem = public_path_for(path).name.removesuffix(".pub.pem")
    make_console().print(
        f"private key: {path} (mode 0600; never commit it)\npublic key:  {public_path_for(path)}\n"
        f"keyid:       {signer.public_key.keyid}\n\n"
        f"To trust it by default, copy the public key to evidence/keys/{stem}.pub.pem and add to "
        f"evidence/trust.yaml:\n"
        f"  - name: {stem}\n    keyid: {signer.public_key.keyid}\n    public_key: keys/{stem}.pub.pem\n"
        f"    owner: <who holds the private key>\n    manifests: [<manifest names it may sign>]", markup=False)


@app.command()
def check(
    op: Annotated[str, typer.Option("--op", metavar="NAME", help="op name")],
    profile: Annotated[str, typer.Option("--profile", metavar="NAME", help="profile name")],
    layout: Annotated[str, typer.Option("--layout", metavar="NAME", help="layout name")],
    candidate: Annotated[str | None, typer.Option("--candidate", metavar="IMPL",
                                                  help="implementation id instead of the declared one")] = None,
    manifest: ManifestOpt = None,
    reruns: RerunsOpt = None,
    allow_plugins: AllowPluginsOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the CellResult as JSON")] = False,
    cell_fn: CellFnOpt = DEFAULT_CELL_FN,
    loader: LoaderOpt = DEFAULT_LOADER,
) -> None:
    """Run one cell here, with every per-tensor diagnostic."""
    from gradsweep.sweep.check import check_cell, render_check

    try:
        rec, code = check_cell(manifest, op, profile, layout, candidate=candidate, cell_fn=cell_fn,
                               loader=loader, reruns=reruns, allow_plugins=allow_plugins)
    except BadInput as exc:
        fail(exc)
    if as_json:
        from gradsweep.evidence.jsonsafe import jsonable

        sys.stdout.write(json.dumps(jsonable(rec.model_dump(mode="python")), indent=2) + "\n")
    else:
        render_check(rec, make_console())
    raise typer.Exit(code)


@app.command()
def drift(
    profile: Annotated[Names, typer.Option("--profile", metavar="NAME", help="profile whose chain runs both roles "
                                           "(repeat for several pairs; default torch_bf16)")] = None,
    train: Annotated[str, typer.Option("--train", metavar="LAYOUT", help="train-style layout")] = "bn_full",
    infer: Annotated[str, typer.Option("--infer", metavar="LAYOUT", help="inference-style layout")] = "decode",
    infer_profile: Annotated[str | None, typer.Option("--infer-profile", metavar="NAME", help="run the inference "
                                                      "role on this profile instead (cross-backend parity)")] = None,
    manifest: ManifestOpt = None,
    layers: Annotated[int | None, typer.Option("--layers", metavar="N", help="chain layers")] = None,
    hidden: Annotated[int | None, typer.Option("--hidden", metavar="N", help="chain hidden size")] = None,
    inner: Annotated[int | None, typer.Option("--inner", metavar="N", help="chain intermediate size")] = None,
    vocab: Annotated[int | None, typer.Option("--vocab", metavar="N", help="chain vocabulary size")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", metavar="DIR", help="write drift.json, drift.table.txt, "
                                             "drift.png and the signed drift.evidence.json here")] = None,
    key: KeyOpt = None,
    dlogp: Annotated[bool, typer.Option("--dlogp/--no-dlogp", help="attribute the logp difference to each "
                                        "differing boundary (one re-run of the train role each)")] = True,
    rl: Annotated[bool, typer.Option("--rl/--no-rl", help="the RL loss fragments as the last boundaries")] = True,
    reruns: Annotated[int, typer.Option("--reruns", metavar="N", help="bitwise re-runs of each role of a profile "
                                        "that advertises deterministic logp")] = 1,
    allow_plugins: AllowPluginsOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Which operator boundary makes train-style and inference-style log-probs differ.

    Runs the Qwen3-shaped chain (manifest ops.chain shape, else --layers/--hidden/...) in a train-style and an
    inference-style role and compares every boundary; exit 1 when a bitwise pair differs, a parity side is
    outside the contract, or an advertised deterministic profile does not repeat.
    """
    from gradsweep.drift.command import DriftRequest, run_and_render

    req = DriftRequest(manifest, list(profile or ["torch_bf16"]), train, infer, infer_profile, layers, hidden, inner,
                       vocab, out, key, dlogp, rl, reruns, allow_plugins)
    try:
        _report, text, code = run_and_render(req, as_json, say=say)
    except BadInput as exc:
        fail(exc)
    sys.stdout.write(text)
    raise typer.Exit(code)


class ListWhat(str, Enum):
    ops = "ops"
    profiles = "profiles"
    layouts = "layouts"


@app.command("list")
def list_names(
    what: Annotated[ListWhat, typer.Argument(metavar="ops|profiles|layouts", help="what to list")],
    manifest: Annotated[Path | None, typer.Option("--manifest", metavar="YAML",
                                                  help="list what this manifest sweeps instead")] = None,
    allow_plugins: AllowPluginsOpt = False,
    loader: LoaderOpt = DEFAULT_LOADER,
) -> None:
    """List the known ops, profiles or layouts."""
    names: list[str]
    if manifest is not None or what is ListWhat.profiles:
        from gradsweep.sweep.manifest_info import load_info

        try:
            info = load_info(manifest, loader, allow_plugins)
        except BadInput as exc:
            fail(exc)
        attr = {"ops": "op", "profiles": "profile", "layouts": "layout"}[what.value]
        names = list(dict.fromkeys(getattr(c, attr) for c in info.cells))
        if what is ListWhat.profiles:
            names = list(dict.fromkeys(list(info.profile_env) + names))
    elif what is ListWhat.ops:
        from gradsweep.ops.registry import op_names

        names = list(op_names())
    else:
        from gradsweep.layouts import LAYOUT_NAMES

        names = list(LAYOUT_NAMES)
    sys.stdout.write("".join(f"{n}\n" for n in names))


@app.command()
def schema() -> None:
    """Print the manifest JSON Schema."""
    from gradsweep.manifest import Manifest

    sys.stdout.write(json.dumps(Manifest.model_json_schema(), indent=2) + "\n")


def main() -> None:
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


if __name__ == "__main__":
    main()
