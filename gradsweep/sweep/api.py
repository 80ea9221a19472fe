"""The sweep as a library call: prepare (validate everything, write nothing), then execute.

The CLI is a thin layer over ``prepare_sweep`` / ``execute_sweep``; tests call them directly.
Every bad input is raised as BadInput by ``prepare_sweep``, before any file is created.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from securesystemslib.signer import CryptoSigner

from gradsweep.evidence.envelope import seal, write_atomic
from gradsweep.evidence.predicate import ManifestRef, Predicate, RunRecord, Selection, SourceRef
from gradsweep.evidence.provenance import Provenance, collect_provenance
from gradsweep.evidence.signing import KeyFileError, resolve_signer
from gradsweep.evidence.source_digest import TreeDigest, repo_root, tree_digest
from gradsweep.evidence.statement import build_statement
from gradsweep.results import CellKey, CellResult
from gradsweep.sweep.assemble import assemble_predicate
from gradsweep.sweep.errors import BadInput
from gradsweep.sweep.manifest_info import ManifestInfo, load_info
from gradsweep.sweep.partial import PartialLog, partial_path
from gradsweep.sweep.resolve import DEFAULT_CELL_FN, DEFAULT_LOADER
from gradsweep.sweep.runner import DEFAULT_TIMEOUT_S, RunSpec, default_jobs, run_cells
from gradsweep.sweep.shard import Shard, cells_digest, parse_shard, select_shard
from gradsweep.sweep.tracked import TrackedEntry, default_tracked_path, load_tracked

Say = Callable[[str], None]


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class SweepOptions:
    manifest: Path | None = None
    ops: list[str] | None = None
    profiles: list[str] | None = None
    layouts: list[str] | None = None
    shard: str | None = None
    out: Path | None = None
    resume: bool = False
    strict: bool = False
    jobs: int | None = None
    cell_timeout: float | None = None
    key: Path | None = None
    tracked: Path | None = None
    cell_fn: str = DEFAULT_CELL_FN
    loader: str = DEFAULT_LOADER
    tree: Path | None = None
    argv: list[str] = field(default_factory=list)


@dataclass
class SweepPlan:
    opts: SweepOptions
    info: ManifestInfo
    selection: Selection
    shard: Shard | None
    cells: list[CellKey]
    out: Path
    signer: CryptoSigner
    tracked: list[TrackedEntry]
    tracked_path: Path | None
    source: TreeDigest
    partial: PartialLog
    kept: list[CellResult]
    started_at: str
    jobs: int
    timeout_s: float

    @property
    def remaining(self) -> list[CellKey]:
        done = {r.key.id for r in self.kept}
        return [c for c in self.cells if c.id not in done]


@dataclass
class SweepOutcome:
    predicate: Predicate
    out: Path
    exit_code: int


def _check_filter(kind: str, wanted: list[str] | None, known: set[str]) -> None:
    for name in wanted or []:
        if name not in known:
            raise BadInput(f"unknown {kind} {name!r} (known: {', '.join(sorted(known))})")


def select_cells(info: ManifestInfo, ops: list[str] | None, profiles: list[str] | None,
                 layouts: list[str] | None) -> list[CellKey]:
    """The manifest's cells after --op/--profile/--layout filters; unknown names are BadInput."""
    _check_filter("op", ops, {c.op for c in info.cells})
    _check_filter("profile", profiles, {c.profile for c in info.cells} | set(info.profile_env))
    _check_filter("layout", layouts, {c.layout for c in info.cells})
    chosen = [c for c in info.cells
              if (not ops or c.op in ops) and (not profiles or c.profile in profiles)
              and (not layouts or c.layout in layouts)]
    if not chosen:
        raise BadInput("no cell of the manifest matches the --op/--profile/--layout filters")
    return chosen


def default_out(info: ManifestInfo, shard: Shard | None) -> Path:
    suffix = f".shard-{shard.index}-of-{shard.count}" if shard else ""
    return Path("out") / f"{info.name}{suffix}.evidence.json"


def _check_out(out: Path) -> None:
    if out.is_dir():
        raise BadInput(f"--out {out}: is a directory; give a file path")
    parent = out.parent if str(out.parent) else Path(".")
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise BadInput(f"--out {out}: {probe} is not a directory")
    if not os.access(probe, os.W_OK):
        raise BadInput(f"--out {out}: {probe} is not writable")
    if partial_path(out).is_dir():
        raise BadInput(f"--out {out}: {partial_path(out)} is a directory")


def prepare_sweep(opts: SweepOptions, say: Say) -> SweepPlan:
    """Validate every input and resolve the key; raises BadInput and writes nothing on bad input."""
    shard = parse_shard(opts.shard) if opts.shard else None
    if opts.jobs is not None and opts.jobs < 1:
        raise BadInput(f"--jobs {opts.jobs}: must be at least 1")
    if opts.cell_timeout is not None and opts.cell_timeout <= 0:
        raise BadInput(f"--cell-timeout {opts.cell_timeout:g}: must be positive")
    info = load_info(opts.manifest, opts.loader)
    filtered = select_cells(info, opts.ops, opts.profiles, opts.layouts)
    cells = select_shard(filtered, shard)
    out = opts.out or default_out(info, shard)
    _check_out(out)
    tracked_path = opts.tracked or default_tracked_path(info.path)
    if opts.tracked is not None and not opts.tracked.is_file():
        raise BadInput(f"--tracked {opts.tracked}: no such file")
    tracked = load_tracked(tracked_path) if tracked_path.is_file() else []
    try:
        signer, _key_path = resolve_signer(opts.key, say)
    except KeyFileError as exc:
        raise BadInput(str(exc)) from None
    source = tree_digest(opts.tree or repo_root())
    selection = Selection(ops=opts.ops or None, profiles=opts.profiles or None, layouts=opts.layouts or None,
                          cells_total=len(filtered), cells_digest=cells_digest(filtered),
                          shards=[shard.spec] if shard else [])
    started = now_utc()
    header = {"manifest_sha256": info.sha256, "source_sha256": source.sha256, "cell_fn": opts.cell_fn,
              "cells_digest": cells_digest(cells), "started_at": started}
    partial = PartialLog(partial_path(out), header)
    kept: list[CellResult] = []
    if opts.resume:
        kept, earlier = partial.read_resumable()
        wanted = {c.id for c in cells}
        kept = [r for r in kept if r.key.id in wanted]
        if earlier:
            started = earlier
            partial.header["started_at"] = earlier
        say(f"resuming: {len(kept)} of {len(cells)} cells already done, {len(cells) - len(kept)} to run"
            if kept or earlier else f"--resume: no partial results at {partial.path}; starting fresh")
    timeout = opts.cell_timeout or info.cell_timeout_s or DEFAULT_TIMEOUT_S
    return SweepPlan(opts=opts, info=info, selection=selection, shard=shard, cells=cells, out=out,
                     signer=signer, tracked=tracked,
                     tracked_path=tracked_path if tracked_path.is_file() else None,
                     source=source, partial=partial, kept=kept, started_at=started,
                     jobs=opts.jobs or default_jobs(), timeout_s=float(timeout))


def execute_sweep(plan: SweepPlan, on_result: Callable[[CellResult], None] | None = None,
                  provenance: Provenance | None = None) -> SweepOutcome:
    """Run the remaining cells, then write signed evidence atomically and remove the partial log.

    On an interruption (KeyboardInterrupt) the partial log stays for ``--resume``.
    """
    provenance = provenance or collect_provenance(plan.opts.tree or repo_root())
    plan.partial.open(plan.kept)
    results = list(plan.kept)

    def record(result: CellResult) -> None:
        plan.partial.append(result)
        results.append(result)
        if on_result:
            on_result(result)

    spec = RunSpec(manifest_path=plan.info.path, cells=plan.remaining, profile_env=plan.info.profile_env,
                   cell_fn=plan.opts.cell_fn, loader=plan.opts.loader, timeout_s=plan.timeout_s,
                   jobs=plan.jobs)
    try:
        run_cells(spec, record)
    finally:
        plan.partial.close()
    run = RunRecord(shard=plan.shard.spec if plan.shard else None, started_at=plan.started_at,
                    finished_at=now_utc(), argv=plan.opts.argv, jobs=plan.jobs, cell_timeout_s=plan.timeout_s,
                    resumed_cells=len(plan.kept), cell_fn=plan.opts.cell_fn, provenance=provenance)
    predicate = build_predicate(plan, results, [run])
    write_atomic(plan.out, seal(build_statement(predicate), plan.signer))
    plan.partial.remove()
    return SweepOutcome(predicate=predicate, out=plan.out, exit_code=predicate.verdict.exit_code)


def build_predicate(plan: SweepPlan, results: list[CellResult], runs: list[RunRecord]) -> Predicate:
    info = plan.info
    return assemble_predicate(
        manifest=ManifestRef(name=info.name, version=info.version, path=display_path(info.path),
                             sha256=info.sha256),
        contract=info.contract,
        source=SourceRef(sha256=plan.source.sha256, files=plan.source.files, roots=list(plan.source.roots)),
        selection=plan.selection, runs=runs, results=results, tracked=plan.tracked,
        tracked_file=display_path(plan.tracked_path) if plan.tracked_path else None, strict=plan.opts.strict)


def display_path(path: Path) -> str:
    """Repo-relative when inside the checkout, so evidence does not leak home directories."""
    try:
        return path.resolve().relative_to(repo_root()).as_posix()
    except ValueError:
        return path.name
