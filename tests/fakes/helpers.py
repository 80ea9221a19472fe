"""Helpers shared by the sweep/evidence/CLI tests: tiny manifests and the fake loader/cell refs."""

from __future__ import annotations

from pathlib import Path

import yaml

FAKE_LOADER = "tests.fakes.manifest:load_manifest"
FAKE_CELL = "tests.fakes.cells:cell"
REPO = Path(__file__).resolve().parents[2]


def write_manifest(directory: Path, behaviour: dict[str, str] | None = None, name: str = "tiny",
                   ops: tuple[str, ...] = ("a", "b"), layouts: tuple[str, ...] = ("x", "y"),
                   profiles: tuple[str, ...] = ("p1", "p2"), **extra: object) -> Path:
    """A fake manifest; each profile's env sets GRADSWEEP_FAKE_PROFILE so tests can see env isolation."""
    data = {"name": name, "manifest_version": 1, "contract_version": "fake-1", "ops": list(ops),
            "layouts": list(layouts), "profiles": {p: {"env": {"GRADSWEEP_FAKE_PROFILE": p}} for p in profiles},
            "behaviour": behaviour or {}, **extra}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
