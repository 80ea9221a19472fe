"""The sweep as a library call: prepare (validate everything, write nothing), then execute.

The CLI is a thin layer over ``prepare_sweep`` / ``execute_sweep``; tests call them directly.
Every bad input is raised as BadInput by ``prepare_sweep``, before any file is created.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from securesystemslib.signer import CryptoSigner

from gradsweep.errors import BadInput
from gradsweep.evidence.envelope import seal, write_atomic
from gradsweep.evidence.extension import extension_digest, planner_digest
from gradsweep.evidence.paths import portable_argv, portable_path
from gradsweep.evidence.predicate import ExtensionRef, ManifestRef, Predicate, RunRecord, Selection, SourceRef
from gradsweep.evidence.provenance import Provenance, collect_provenance, gpu_names
from gradsweep.evidence.result_statement import build_result_statement, result_statement_path
from gradsweep.evidence.signing import KeyFileError, public_path_for, resolve_signer, signing_key_location
from gradsweep.evidence.source_digest import TreeDigest, file_sha256, repo_root, tree_digest
from gradsweep.evidence.statement import build_statement
from gradsweep.evidence.trust import default_trust_file
from gradsweep.resolve import DEFAULT_CELL_FN, DEFAULT_LOADER
from gradsweep.results import CellKey, CellResult
from gradsweep.sweep.assemble import assemble_predicate
from gradsweep.sweep.manifest_info import ManifestInfo, load_info
from gradsweep.sweep.memory import FreeMemory, check_memory, measured_free
from gradsweep.sweep.outputs import check_not_input, check_replace_evidence, check_writable
from gradsweep.sweep.partial import PartialLog, partial_path
from gradsweep.sweep.placement import placed_profiles, visible_gpus
from gradsweep.sweep.runner import DEFAULT_TIMEOUT_S, RunSpec, default_jobs, run_cells
from gradsweep.sweep.shard import Shard, cells_digest, parse_shard, select_shard
from gradsweep.tracked_reds import TrackedEntry, default_tracked_path, load_tracked

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
    force: bool = False
    strict: bool = False
    jobs: int | None = None
    cell_timeout: float | None = None
    reruns: int | None = None
    key: Path | None = None
    tracked: Path | None = None
    allow_plugins: bool = False
    cell_fn: str = DEFAULT_CELL_FN
    loader: str = DEFAULT_LOADER
    tree: Path | None = None
    argv: list[str] = field(default_factory=list)
    gpus: list[str] | None = None  # CUDA_VISIBLE_DEVICES ids to place workers on; None: detect
    free_memory: FreeMemory = measured_free  # injectable for tests


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
    reruns: int
    gpus: list[str]
    placed: frozenset[str]
    root: Path
    tracked_sha256: str | None
    extension: tuple[Path, str] | None
    planner: tuple[Path, str] | None

    @property
    def remaining(self) -> list[CellKey]:
        done = {r.key.id for r in self.kept}
        return [c for c in self.cells if c.id not in done]


@dataclass
class SweepOutcome:
    predicate: Predicate
    out: Path
    result_statement: Path
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


def _check_options(opts: SweepOptions) -> Shard | None:
    shard = parse_shard(opts.shard) if opts.shard else None
    if opts.jobs is not None and opts.jobs < 1:
        raise BadInput(f"--jobs {opts.jobs}: must be at least 1")
    if opts.cell_timeout is not None and opts.cell_timeout <= 0:
        raise BadInput(f"--cell-timeout {opts.cell_timeout:g}: must be positive")
    if opts.reruns is not None and opts.reruns < 1:
        raise BadInput(f"--reruns {opts.reruns}: must be at least 1")
    return shard


def _check_outputs(opts: SweepOptions, info: ManifestInfo, out: Path, tracked_path: Path | None) -> None:
    """The evidence, the test result and the partial log may not land on an input or on foreign evidence."""
    check_writable(out)
    partial = partial_path(out)
    if partial.is_dir():
        raise BadInput(f"--out {out}: {partial} is a directory")
    key = signing_key_location(opts.key)
    check_not_input({"output": out, "partial log": partial, "test result": result_statement_path(out)},
                    {"manifest": info.path, "contract": info.contract_path, "tracked-reds file": tracked_path,
                     "signing key": key, "signing key's public key": public_path_for(key),
                     "trust file": default_trust_file()})
    check_replace_evidence(out, info.name, opts.force)


def _resume(opts: SweepOptions, partial: PartialLog, cells: list[CellKey], say: Say,
            started: str) -> tuple[list[CellResult], str]:
    """Results kept from an interrupted run; without --resume, a log with finished cells is refused."""
    if not opts.resume:
        found = partial.count_results()
        if found:
            raise BadInput(f"{partial.path} holds {found} finished cell(s) of an interrupted run; pass --resume "
                           "to continue it, or delete the file to start over")
        return [], started
    kept, earlier = partial.read_resumable()
    wanted = {c.id for c in cells}
    kept = [r for r in kept if r.key.id in wanted]
    if earlier:
        started = earlier
        partial.header["started_at"] = earlier
    say(f"resuming: {len(kept)} of {len(cells)} cells already done, {len(cells) - len(kept)} to run"
        if kept or earlier else f"--resume: no partial results at {partial.path}; starting fresh")
    return kept, started


def prepare_sweep(opts: SweepOptions, say: Say) -> SweepPlan:
    """Validate every input and resolve the key; raises BadInput and writes nothing on bad input."""
    shard = _check_options(opts)
    info = load_info(opts.manifest, opts.loader, opts.allow_plugins)
    filtered = select_cells(info, opts.ops, opts.profiles, opts.layouts)
    cells = select_shard(filtered, shard)
    out = opts.out or default_out(info, shard)
    if opts.tracked is not None and not opts.tracked.is_file():
        raise BadInput(f"--tracked {opts.tracked}: no such file")
    tracked_path = opts.tracked or default_tracked_path(info.path)
    tracked_path = tracked_path if tracked_path.is_file() else None
    tracked = load_tracked(tracked_path) if tracked_path else []
    _check_outputs(opts, info, out, tracked_path)
    gpu_profiles = {p for p, d in info.profile_device.items() if d in ("cuda", "auto")}
    gpus = opts.gpus if opts.gpus is not None else (visible_gpus() if gpu_profiles else [])
    placed = placed_profiles(info.profile_device, info.profile_env, gpus)
    check_memory(info.manifest, cells, gpus_visible=bool(gpus), free=opts.free_memory)
    root = (opts.tree or repo_root()).resolve()
    source = tree_digest(root)
    reruns = opts.reruns or info.reruns
    ext, planner = extension_digest(root), planner_digest(root)
    header = {"manifest_sha256": info.sha256, "source_sha256": source.sha256, "cell_fn": opts.cell_fn,
              "loader": opts.loader, "contract_sha256": info.contract.sha256, "reruns": reruns,
              "extension_sha256": ext[1] if ext else None, "planner_sha256": planner[1] if planner else None,
              "cells_digest": cells_digest(cells), "gpus": gpu_names(gpus),
              "started_at": now_utc()}
    partial = PartialLog(partial_path(out), header)
    kept, started = _resume(opts, partial, cells, say, header["started_at"])
    try:
        signer, _key_path = resolve_signer(opts.key, say)
    except KeyFileError as exc:
        raise BadInput(str(exc)) from None
    selection = Selection(ops=opts.ops or None, profiles=opts.profiles or None, layouts=opts.layouts or None,
                          cells_total=len(filtered), cells_digest=cells_digest(filtered),
                          shards=[shard.spec] if shard else [], reruns=reruns)
    timeout = opts.cell_timeout or info.cell_timeout_s or DEFAULT_TIMEOUT_S
    jobs = opts.jobs or default_worker_count(info.profile_device, placed, cells, len(gpus))
    return SweepPlan(opts=opts, info=info, selection=selection, shard=shard, cells=cells, out=out,
                     signer=signer, tracked=tracked, tracked_path=tracked_path, source=source, partial=partial,
                     kept=kept, started_at=started, jobs=jobs, timeout_s=float(timeout), reruns=reruns,
                     gpus=gpus, placed=placed, root=root,
                     tracked_sha256=file_sha256(tracked_path) if tracked_path else None, extension=ext,
                     planner=planner)


def default_worker_count(devices: dict[str, str], placed: frozenset[str], cells: list[CellKey],
                         gpus: int) -> int:
    """One worker per GPU for the placed (GPU) profiles, plus the usual CPU workers when profiles that are not
    placed have cells too: a GPU is never shared by default, and CPU cells still run beside the GPU ones."""
    if not placed:
        return default_jobs()
    unplaced = any(c.profile not in placed and c.profile in devices for c in cells)
    return gpus + (default_jobs() if unplaced else 0)


def execute_sweep(plan: SweepPlan, on_result: Callable[[CellResult], None] | None = None,
                  provenance: Provenance | None = None) -> SweepOutcome:
    """Run the remaining cells, then write signed evidence atomically and remove the partial log.

    On an interruption (KeyboardInterrupt) the partial log stays for ``--resume``.
    """
    provenance = provenance or collect_provenance(plan.root)
    plan.partial.open(plan.kept)
    results = list(plan.kept)

    def record(result: CellResult) -> None:
        plan.partial.append(result)
        results.append(result)
        if on_result:
            on_result(result)

    spec = RunSpec(manifest_path=plan.info.path, cells=plan.remaining, profile_env=plan.info.profile_env,
                   cell_fn=plan.opts.cell_fn, loader=plan.opts.loader, timeout_s=plan.timeout_s,
                   jobs=plan.jobs, reruns=plan.opts.reruns, allow_plugins=plan.opts.allow_plugins,
                   gpus=plan.gpus, placed=plan.placed)
    try:
        run_cells(spec, record)
    finally:
        plan.partial.close()
    run = RunRecord(shard=plan.shard.spec if plan.shard else None, started_at=plan.started_at,
                    finished_at=now_utc(), argv=portable_argv(plan.opts.argv, plan.root), jobs=plan.jobs,
                    cell_timeout_s=plan.timeout_s, resumed_cells=len(plan.kept), cell_fn=plan.opts.cell_fn,
                    loader=plan.opts.loader, plugins=plan.info.plugins if plan.opts.allow_plugins else [],
                    provenance=provenance)
    predicate = build_predicate(plan, results, [run])
    result_path = write_evidence(plan.out, predicate, plan.signer)
    plan.partial.remove()
    return SweepOutcome(predicate=predicate, out=plan.out, result_statement=result_path,
                        exit_code=predicate.verdict.exit_code)


def write_evidence(out: Path, predicate: Predicate, signer: CryptoSigner) -> Path:
    """The Test Result statement first, then the evidence: a present evidence file has its companion."""
    result_path = result_statement_path(out)
    write_atomic(result_path, seal(build_result_statement(predicate), signer))
    write_atomic(out, seal(build_statement(predicate), signer))
    return result_path


def build_predicate(plan: SweepPlan, results: list[CellResult], runs: list[RunRecord]) -> Predicate:
    info, root = plan.info, plan.root
    prov = runs[0].provenance if runs else None
    contract = info.contract.model_copy(update={
        "path": portable_path(info.contract_path, root) if info.contract_path else None})
    return assemble_predicate(
        manifest=ManifestRef(name=info.name, version=info.version, path=portable_path(info.path, root),
                             sha256=info.sha256),
        contract=contract,
        source=SourceRef(sha256=plan.source.sha256, files=plan.source.files, roots=list(plan.source.roots)),
        selection=plan.selection, runs=runs, results=results, tracked=plan.tracked,
        tracked_file=portable_path(plan.tracked_path, root) if plan.tracked_path else None,
        tracked_sha256=plan.tracked_sha256,
        extension=ExtensionRef.of(plan.extension, root, prov.cuda_extension if prov is not None else None),
        planner=ExtensionRef.of(plan.planner, root), strict=plan.opts.strict)
