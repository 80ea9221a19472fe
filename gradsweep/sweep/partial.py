"""The partial-results log ``<out>.partial.jsonl``: one line per finished cell, fsync'd as it lands.

The first line is a header identifying the run (manifest digest, selection digest); ``--resume``
only reuses a log whose header matches the current run. A torn last line (a kill mid-write) is
ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gradsweep.errors import BadInput
from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.results import CellResult


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + ".partial.jsonl")


def _line(obj: Any) -> bytes:
    return (json.dumps(jsonable(obj), sort_keys=True, allow_nan=False) + "\n").encode()


class PartialLog:
    """Append-only log of finished cells for one output path."""

    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self.header = header
        self._fh: Any = None

    def read_resumable(self) -> tuple[list[CellResult], str | None]:
        """Results recorded by an earlier, interrupted run of the same selection (and its start time)."""
        if not self.path.exists():
            return [], None
        lines = self.path.read_bytes().splitlines()
        try:
            head = json.loads(lines[0]) if lines else None
        except json.JSONDecodeError:
            head = None
        if not isinstance(head, dict) or head.get("header") is None:
            raise BadInput(f"--resume: {self.path} is not a gradsweep partial log; "
                           "delete it or drop --resume")
        mine = {k: v for k, v in self.header.items() if k != "started_at"}
        theirs = {k: v for k, v in head["header"].items() if k != "started_at"}
        if mine != theirs:
            diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            raise BadInput(f"--resume: {self.path} is from a different run ({', '.join(diff)} differ); "
                           "delete it or drop --resume")
        results: dict[str, CellResult] = {}
        for raw in lines[1:]:
            try:
                result = CellResult.model_validate(json.loads(raw)["result"])
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                continue  # a torn line from a kill mid-write
            results[result.key.id] = result
        return list(results.values()), head["header"].get("started_at")

    def count_results(self) -> int:
        """How many finished cells an existing log holds (0 when there is none): what a fresh start would lose."""
        if not self.path.is_file():
            return 0
        try:
            lines = self.path.read_bytes().splitlines()
        except OSError:
            return 0
        return sum(1 for raw in lines[1:] if b'"result"' in raw)

    def open(self, keep: list[CellResult]) -> None:
        """Start the log afresh with the header and the results being kept."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "wb")
        self._fh.write(_line({"header": self.header}))
        for result in keep:
            self._fh.write(_line({"result": result.model_dump(mode="python")}))
        self._sync()

    def append(self, result: CellResult) -> None:
        self._fh.write(_line({"result": result.model_dump(mode="python")}))
        self._sync()

    def _sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def remove(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
