"""Assemble a predicate from results: tracked marks, tally, stale entries and the verdict.

Shared by sweep and merge so a merged evidence is judged exactly like an unsharded one.
"""

from __future__ import annotations

from gradsweep.evidence.predicate import (
    ContractRef,
    ExtensionRef,
    ManifestRef,
    Predicate,
    RunRecord,
    Selection,
    SourceRef,
)
from gradsweep.results import CellResult
from gradsweep.sweep.tally import mark, tally, verdict
from gradsweep.tracked_reds import TrackedEntry


def generator_name() -> str:
    from importlib import metadata

    try:
        return f"gradsweep {metadata.version('gradsweep')}"
    except metadata.PackageNotFoundError:
        return "gradsweep (source checkout)"


def assemble_predicate(*, manifest: ManifestRef, contract: ContractRef, source: SourceRef,
                       selection: Selection, runs: list[RunRecord], results: list[CellResult],
                       tracked: list[TrackedEntry], tracked_file: str | None, tracked_sha256: str | None,
                       extension: ExtensionRef | None, strict: bool, planner: ExtensionRef | None = None) -> Predicate:
    records = mark(results, tracked)
    counts, stale = tally(records, tracked)
    return Predicate(generator=generator_name(), manifest=manifest, contract=contract, source=source,
                     selection=selection, runs=runs, tracked_file=tracked_file, tracked_sha256=tracked_sha256,
                     extension=extension, planner=planner, tracked_entries=tracked,
                     stale_tracked=stale, cells=records, tally=counts, verdict=verdict(counts, strict))
