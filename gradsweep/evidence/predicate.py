"""The closeout predicate: what a sweep proved, cell by cell, and under which conditions.

Typed so that report, diff and merge read exactly what sweep wrote.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gradsweep.evidence.paths import portable_path
from gradsweep.evidence.provenance import Provenance
from gradsweep.results import CellResult
from gradsweep.tracked_reds import TrackedEntry

PREDICATE_TYPE = "https://gradsweep.dev/closeout/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManifestRef(_Strict):
    name: str
    version: int
    path: str
    sha256: str


class ContractRef(_Strict):
    version: str | None = None
    path: str | None = Field(None, description="repository-relative path (see evidence.paths)")
    sha256: str | None = Field(None, description="digest of the contract file the verdicts used")


class ExtensionRef(_Strict):
    """A built module the workers imported (a per-machine build product): the CUDA extension, the fold planner."""

    path: str = Field(description="repository-relative path of gradsweep/_C*.so or gradsweep/_fold_plan*.so")
    sha256: str
    build: dict[str, object] | None = Field(None, description="gradsweep._C.build_info(): nvcc flags, arch")

    @classmethod
    def of(cls, found: tuple[Path, str] | None, root: Path,
           build: dict[str, object] | None = None) -> ExtensionRef | None:
        """The record of a build found under ``root`` (``extension_digest`` / ``planner_digest``: path and
        sha256), or None when none is built there."""
        return None if found is None else cls(path=portable_path(found[0], root), sha256=found[1], build=build)


class SourceRef(_Strict):
    sha256: str
    files: int
    roots: list[str]


class Selection(_Strict):
    """Which cells this evidence covers: the filtered set, and the shard of it."""

    ops: list[str] | None = None
    profiles: list[str] | None = None
    layouts: list[str] | None = None
    cells_total: int = Field(description="cells after filters, before sharding")
    cells_digest: str = Field(description="sha256 of the sorted filtered cell ids")
    shards: list[str] = Field(default_factory=list, description="K/N of each shard included; [] unsharded")
    reruns: int | None = Field(None, description="effective reruns of the reference layout (--reruns or "
                                                  "the manifest's); null in evidence that predates it")


class RunRecord(_Strict):
    """One sweep invocation (a merged evidence holds one per shard)."""

    shard: str | None = None
    started_at: str
    finished_at: str
    argv: list[str]
    jobs: int
    cell_timeout_s: float
    resumed_cells: int = 0
    cell_fn: str
    loader: str | None = Field(None, description="manifest loader (null in evidence that predates it)")
    plugins: list[str] = Field(default_factory=list, description="plugin modules imported (--allow-plugins)")
    provenance: Provenance


class CellRecord(_Strict):
    """A cell's result and, for a red, the tracked-reds entry covering it (None: untracked)."""

    result: CellResult
    tracked: TrackedEntry | None = None

    @property
    def untracked_red(self) -> bool:
        return self.result.status.is_red and self.tracked is None


class Tally(_Strict):
    total: int
    by_status: dict[str, int]
    tracked_red: int
    untracked_red: int
    stale_tracked: int


class Verdict(_Strict):
    exit_code: int
    summary: str
    strict: bool


class Predicate(_Strict):
    """Schema 2 adds the digests of every verdict input (contract, tracked reds, extension), reruns,
    the loader and plugins; schema 1 evidence still reads, but ``verify`` calls it stale. ``planner`` (optional,
    schema 2) pins the compiled fold planner."""

    schema_version: Literal[1, 2] = 2
    generator: str
    manifest: ManifestRef
    contract: ContractRef
    source: SourceRef
    selection: Selection
    runs: list[RunRecord]
    tracked_file: str | None = None
    tracked_sha256: str | None = None
    extension: ExtensionRef | None = None
    planner: ExtensionRef | None = Field(None, description="the compiled fold planner (gradsweep._fold_plan) the "
                                         "run's folds planned with; None: numpy, or evidence from before it")
    tracked_entries: list[TrackedEntry] = Field(default_factory=list)
    stale_tracked: list[TrackedEntry] = Field(default_factory=list)
    cells: list[CellRecord]
    tally: Tally
    verdict: Verdict
