"""The ``gradsweep`` command line: a thin Typer layer over gradsweep.sweep, .evidence and .report.

Run as ``gradsweep ...`` (console script) or ``python -m gradsweep.cli ...``.
"""

from __future__ import annotations

import json
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from gradsweep.sweep.errors import BadInput, one_line
from gradsweep.sweep.resolve import DEFAULT_CELL_FN, DEFAULT_LOADER
from gradsweep.sweep.tally import EXIT_FAIL, EXIT_USAGE

EXIT_STALE = 4
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """
Exit codes of sweep, merge and check: 0 every non-skipped cell green or blocked (tracked reds allowed);
1 an untracked red or an error (with --strict also a blocked cell or a stale tracked entry);
2 bad usage, manifest or input (one line on stderr, nothing written); 3 nothing could run (every cell
blocked or skipped); 130 interrupted (partial results kept for --resume).
verify: 0 valid and fresh; 1 bad signature, untrusted key or malformed evidence; 2 bad usage;
4 valid but stale for the current source tree (0 with --allow-stale). diff: 1 when there is a regression.
"""

app = typer.Typer(name="gradsweep", no_args_is_help=True, pretty_exceptions_enable=False,
                  add_completion=False,
                  help="Prove LLM kernels batch-invariant and accurate, cell by cell, as signed evidence.\n\n"
                       + EXIT_CODES_HELP)

out_console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def say(message: str) -> None:
    err_console.print(message, markup=False)


def fail(message: object, code: int = EXIT_USAGE) -> NoReturn:
    """One line on stderr naming the problem, then exit."""
    err_console.print(f"gradsweep: error: {one_line(message)}", markup=False, soft_wrap=True)
    raise typer.Exit(code)


CellFnOpt = Annotated[str, typer.Option("--cell-fn", envvar="GRADSWEEP_CELL_FN", hidden=True,
                                        help="module:function run for each cell (tests plant fakes)")]
LoaderOpt = Annotated[str, typer.Option("--manifest-loader", envvar="GRADSWEEP_MANIFEST_LOADER", hidden=True,
                                        help="module:function that loads a manifest (tests plant fakes)")]
TreeOpt = Annotated[Path | None, typer.Option("--tree", hidden=True,
                                              help="source tree to digest (default: this checkout)")]
TrustedOpt = Annotated[list[Path] | None, typer.Option(
    "--trusted-key", help="trusted public key (PEM); repeatable. Default: your key's .pub.pem and "
                          "evidence/keys/*.pub.pem")]


Names = list[str] | None
OptPath = Path | None
ManifestArg = Annotated[OptPath, typer.Argument(help="manifest YAML (default: manifests/default.yaml)")]
OutOpt = Annotated[OptPath, typer.Option(
    "--out", "-o", help="evidence file (default: out/<manifest name>[.shard-K-of-N].evidence.json)")]
KeyOpt = Annotated[OptPath, typer.Option(
    help="Ed25519 signing key (PEM); default $GRADSWEEP_KEY, else ~/.config/gradsweep/signing-key.pem "
         "(created on first use)")]
TrackedFileOpt = Annotated[OptPath, typer.Option(
    "--tracked", help="tracked reds file (default: tracked_reds.yaml beside the manifest)")]


@app.command()
def sweep(
    manifest: ManifestArg = None,
    op: Annotated[Names, typer.Option("--op", help="only this op (repeatable)")] = None,
    profile: Annotated[Names, typer.Option("--profile", help="only this profile (repeatable)")] = None,
    layout: Annotated[Names, typer.Option("--layout", help="only this layout (repeatable)")] = None,
    shard: Annotated[str | None, typer.Option(help="run shard K/N (1-based) of the sorted cells")] = None,
    out: OutOpt = None,
    resume: Annotated[bool, typer.Option(help="reuse <out>.partial.jsonl of an interrupted run")] = False,
    strict: Annotated[bool, typer.Option(help="blocked cells, stale tracked entries fail")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="parallel workers (default min(2, CPUs))")]
    = None,
    cell_timeout: Annotated[float | None, typer.Option(help="seconds per cell (default: manifest, else 900)")]
    = None,
    key: KeyOpt = None,
    tracked: TrackedFileOpt = None,
    progress: Annotated[bool | None, typer.Option(help="progress bar (default: if stderr is a terminal)")]
    = None,
    cell_fn: CellFnOpt = DEFAULT_CELL_FN,
    loader: LoaderOpt = DEFAULT_LOADER,
    tree: TreeOpt = None,
) -> None:
    """Run every op x profile x layout cell isolated, print the matrix, write signed evidence."""
    from gradsweep.sweep.api import SweepOptions, execute_sweep, prepare_sweep
    from gradsweep.sweep.progress import SweepProgress

    opts = SweepOptions(manifest=manifest, ops=op, profiles=profile, layouts=layout, shard=shard, out=out,
                        resume=resume, strict=strict, jobs=jobs, cell_timeout=cell_timeout, key=key,
                        tracked=tracked, cell_fn=cell_fn, loader=loader, tree=tree, argv=list(sys.argv))
    try:
        plan = prepare_sweep(opts, say)
    except BadInput as exc:
        fail(exc)
    say(f"sweep {plan.info.name}: {len(plan.cells)} cells"
        + (f" (shard {plan.shard.spec})" if plan.shard else "")
        + f", {plan.jobs} worker(s), {plan.timeout_s:g} s per cell -> {plan.out}")
    show_bar = progress if progress is not None else err_console.is_terminal
    with SweepProgress(err_console, total=len(plan.cells), done=plan.kept, bar=show_bar) as bar:
        try:
            outcome = execute_sweep(plan, on_result=bar.update)
        except KeyboardInterrupt:
            bar.stop()
            say(f"interrupted: finished cells are kept in {plan.partial.path}; rerun with --resume")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    from gradsweep.report.table import render_report

    render_report(outcome.predicate, out_console)
    say(f"evidence: {outcome.out} (verify: gradsweep verify {outcome.out})")
    raise typer.Exit(outcome.exit_code)


class Format(str, Enum):
    table = "table"
    md = "md"
    junit = "junit"


@app.command()
def report(
    evidence: Annotated[Path, typer.Argument(help="evidence file")],
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, md (CI step summary) or junit")]
    = Format.table,
    output: Annotated[OptPath, typer.Option("--output", "-o", help="write here instead of stdout")] = None,
) -> None:
    """Render evidence as a terminal table, markdown, or JUnit XML (signature not checked: use verify)."""
    from gradsweep.evidence.verify import EvidenceError, read_evidence

    try:
        pred = read_evidence(evidence)
    except EvidenceError as exc:
        fail(exc)
    if fmt is Format.table:
        from gradsweep.report.table import render_report

        console = out_console if output is None else Console(file=open(output, "w"), width=200)
        render_report(pred, console, max_problems=10_000)
        if output is not None:
            console.file.close()
        return
    if fmt is Format.md:
        from gradsweep.report.markdown import render_markdown

        text = render_markdown(pred)
    else:
        from gradsweep.report.junit import render_junit

        text = render_junit(pred)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)


def _trusted(keys: list[Path] | None) -> list:
    from gradsweep.evidence.signing import KeyFileError, default_trusted_key_paths, load_public_key
    from gradsweep.evidence.source_digest import repo_root

    paths = list(keys) if keys else default_trusted_key_paths(repo_root())
    try:
        return [load_public_key(p) for p in paths]
    except KeyFileError as exc:
        fail(exc)


@app.command()
def verify(
    evidence: Annotated[Path, typer.Argument(help="evidence file")],
    trusted_key: TrustedOpt = None,
    allow_stale: Annotated[bool, typer.Option(help="exit 0 even if the tree changed since the run")] = False,
    tree: TreeOpt = None,
) -> None:
    """Check the signature against trusted keys, then whether the evidence is stale for this tree."""
    from gradsweep.evidence.verify import EvidenceError, verify_evidence

    keys = _trusted(trusted_key)
    try:
        result = verify_evidence(evidence, keys, tree)
    except EvidenceError as exc:
        fail(exc, EXIT_FAIL)
    pred = result.predicate
    prov = pred.runs[0].provenance if pred.runs else None
    out_console.print(f"signature OK: {evidence} signed by {', '.join(result.signed_by)}", markup=False)
    out_console.print(f"manifest {pred.manifest.name} v{pred.manifest.version} ({pred.manifest.path}), "
                      f"contract {pred.contract.version}; {pred.verdict.summary}", markup=False)
    if prov is not None:
        out_console.print(f"ran {pred.runs[0].started_at} on {prov.host}: {prov.gpu_name or 'no GPU'} "
                          f"{prov.sm or ''}, torch {prov.torch}, git {prov.git_commit or 'n/a'}"
                          f"{' (dirty)' if prov.git_dirty else ''}", markup=False)
    if result.stale:
        say(f"STALE: the evidence is for source tree {pred.source.sha256[:16]}, this tree is "
            f"{result.current_source[:16]}; rerun the sweep")
        raise typer.Exit(0 if allow_stale else EXIT_STALE)
    out_console.print(f"fresh: source tree {result.current_source[:16]} matches", markup=False)


@app.command()
def merge(
    shards: Annotated[list[Path], typer.Argument(help="shard evidence files")],
    out: Annotated[Path, typer.Option("--out", "-o", help="merged evidence file")],
    trusted_key: TrustedOpt = None,
    key: Annotated[Path | None, typer.Option(help="signing key for the merged evidence")] = None,
    strict: Annotated[bool, typer.Option(help="blocked cells and stale tracked entries fail")] = False,
) -> None:
    """Merge shard evidence (all K/N present once, same manifest and tree) and re-sign it."""
    from gradsweep.evidence.signing import KeyFileError, resolve_signer
    from gradsweep.report.merge import merge_shards
    from gradsweep.report.table import render_report

    keys = _trusted(trusted_key)
    try:
        signer, _ = resolve_signer(key, say)
        merged = merge_shards(shards, keys, signer, out, strict=strict)
    except (BadInput, KeyFileError) as exc:
        fail(exc)
    render_report(merged, out_console)
    say(f"merged evidence: {out}")
    raise typer.Exit(merged.verdict.exit_code)


@app.command()
def diff(
    old: Annotated[Path, typer.Argument(help="earlier evidence")],
    new: Annotated[Path, typer.Argument(help="later evidence")],
) -> None:
    """Status transitions between two evidence files, regressions first (exit 1 on a regression)."""
    from gradsweep.evidence.verify import EvidenceError, read_evidence
    from gradsweep.report.diff import diff_predicates, render_diff

    try:
        before, after = read_evidence(old), read_evidence(new)
    except EvidenceError as exc:
        fail(exc)
    changes = diff_predicates(before, after)
    out_console.print(render_diff(changes), markup=False)
    raise typer.Exit(EXIT_FAIL if any(t.kind == "regression" for t in changes) else 0)


@app.command()
def keygen(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="private key path "
                                             "(default ~/.config/gradsweep/signing-key.pem)")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing key")] = False,
) -> None:
    """Write an Ed25519 keypair: the private key and <name>.pub.pem beside it."""
    from gradsweep.evidence.signing import KeyFileError, default_key_path, public_path_for, write_keypair

    path = out or default_key_path()
    try:
        signer = write_keypair(path, overwrite=force)
    except KeyFileError as exc:
        fail(exc)
    out_console.print(f"private key: {path}\npublic key:  {public_path_for(path)}\n"
                      f"keyid:       {signer.public_key.keyid}", markup=False)


@app.command()
def check(
    op: Annotated[str, typer.Option(help="op name")],
    profile: Annotated[str, typer.Option(help="profile name")],
    layout: Annotated[str, typer.Option(help="layout name")],
    candidate: Annotated[str | None, typer.Option(help="implementation id instead of the declared one")]
    = None,
    manifest: Annotated[Path | None, typer.Option(help="manifest (default: manifests/default.yaml)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the CellResult as JSON")] = False,
    cell_fn: CellFnOpt = DEFAULT_CELL_FN,
    loader: LoaderOpt = DEFAULT_LOADER,
) -> None:
    """Run one cell in this process and print every per-tensor diagnostic."""
    from gradsweep.sweep.check import check_cell, render_check

    try:
        rec, code = check_cell(manifest, op, profile, layout, candidate=candidate, cell_fn=cell_fn,
                               loader=loader)
    except BadInput as exc:
        fail(exc)
    if as_json:
        from gradsweep.evidence.jsonsafe import jsonable

        sys.stdout.write(json.dumps(jsonable(rec.model_dump(mode="python")), indent=2) + "\n")
    else:
        render_check(rec, out_console)
    raise typer.Exit(code)


@app.command()
def drift(
    profile: Annotated[str, typer.Option(help="profile whose candidates run the chain")] = "torch_bf16",
    train: Annotated[str, typer.Option(help="train-style layout")] = "bn_full",
    infer: Annotated[str, typer.Option(help="inference-style layout")] = "decode",
    manifest: Annotated[Path | None, typer.Option(help="samples, seed and profiles (default: default.yaml)")]
    = None,
    hidden: Annotated[int, typer.Option(help="chain hidden size")] = 64,
    inner: Annotated[int, typer.Option(help="chain intermediate size")] = 96,
    vocab: Annotated[int, typer.Option(help="chain vocabulary size")] = 300,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Attribute drift along embedding -> rms_norm -> linear -> silu -> lm_head -> logp: train vs inference."""
    from gradsweep.drift_cli import run_drift

    try:
        report, text = run_drift(manifest, profile, train, infer, hidden, inner, vocab, as_json)
    except BadInput as exc:
        fail(exc)
    sys.stdout.write(text)
    raise typer.Exit(0 if report.first_divergence is None else 1)


class ListWhat(str, Enum):
    ops = "ops"
    profiles = "profiles"
    layouts = "layouts"


@app.command("list")
def list_names(
    what: Annotated[ListWhat, typer.Argument(help="ops, profiles or layouts")],
    manifest: Annotated[Path | None, typer.Option(help="list what this manifest sweeps instead")] = None,
    loader: LoaderOpt = DEFAULT_LOADER,
) -> None:
    """List the known ops, profiles or layouts."""
    names: list[str]
    if manifest is not None or what is ListWhat.profiles:
        from gradsweep.sweep.manifest_info import load_info

        try:
            info = load_info(manifest, loader)
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
