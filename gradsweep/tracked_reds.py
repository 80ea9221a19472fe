"""Tracked reds: the known red cells, each with its reason and where it is being fixed.

An entry's ``cell`` is a cell id (op/profile/layout) or an fnmatch pattern over ids
(e.g. ``*/torch_bf16/*``). A red cell no entry matches is UNTRACKED and fails the sweep; an entry
whose cells in the sweep are green (none red) is stale.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gradsweep.errors import BadInput
from gradsweep.results import CellResult, Status

TRACKED_FILE_NAME = "tracked_reds.yaml"


class TrackedEntry(BaseModel):
    """One known red: which cell(s), why, and where the fix is tracked."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    cell: str = Field(description="cell id op/profile/layout, or an fnmatch pattern over ids")
    reason: str = Field(min_length=1)
    fix: str = Field(min_length=1, description="where it is being fixed (issue, PR, 'by design: ...')")

    @field_validator("cell")
    @classmethod
    def _three_parts(cls, value: str) -> str:
        parts = value.split("/")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"cell must be op/profile/layout (patterns allowed), got {value!r}")
        return value

    def matches(self, cell_id: str) -> bool:
        return fnmatchcase(cell_id, self.cell)


class _TrackedFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    tracked: list[TrackedEntry] = Field(default_factory=list)


def default_tracked_path(manifest_path: Path) -> Path:
    """tracked_reds.yaml beside the manifest."""
    return manifest_path.resolve().parent / TRACKED_FILE_NAME


def load_tracked(path: Path) -> list[TrackedEntry]:
    """Read and validate a tracked-reds file; any problem is BadInput naming the file and field."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise BadInput(f"tracked reds {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError:
        raise BadInput(f"tracked reds {path}: malformed YAML; fix the syntax") from None
    if data is None:
        return []
    try:
        return _TrackedFile.model_validate(data).tracked
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise BadInput(f"tracked reds {path}: field '{loc}': {err['msg']}") from None


def match_entry(entries: list[TrackedEntry], result: CellResult) -> TrackedEntry | None:
    """The first entry tracking this cell, only if the cell is red (green cells are never 'tracked')."""
    if not result.status.is_red:
        return None
    return next((e for e in entries if e.matches(result.key.id)), None)


def stale_entries(entries: list[TrackedEntry], results: list[CellResult]) -> list[TrackedEntry]:
    """Entries whose cells in this sweep are green and none red: the fix landed, drop the entry.

    Cells that could not be judged here (blocked, skipped, error) never make an entry stale.
    """
    stale = []
    for entry in entries:
        hits = [r for r in results if entry.matches(r.key.id)]
        if any(r.status is Status.GREEN for r in hits) and not any(r.status.is_red for r in hits):
            stale.append(entry)
    return stale
