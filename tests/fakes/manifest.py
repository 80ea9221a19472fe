"""A tiny manifest loader with the shape the sweep needs (name, version, profiles[].env, cells()).

YAML keys: name, manifest_version, contract_version, contract_file (optional: a file whose digest the
evidence records, relative to the manifest), cell_timeout_s (optional), reruns (optional), ops, layouts,
profiles: {name: {env: {...}, device: cpu|cuda|auto}}, behaviour: {cell id or fnmatch pattern: behaviour}
(see cells.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

import yaml

from gradsweep.results import CellKey


@dataclass
class FakeProfile:
    env: dict[str, str] = field(default_factory=dict)
    device: str = "cpu"


@dataclass
class FakeManifest:
    name: str
    manifest_version: int
    contract_version: str
    ops: list[str]
    layouts: list[str]
    profiles: dict[str, FakeProfile]
    behaviour: dict[str, str]
    source_path: Path
    cell_timeout_s: float | None = None
    reruns: int = 1
    contract_file: str | None = None
    plugins: list[str] = field(default_factory=list)

    @property
    def contract_path(self) -> Path | None:
        return None if self.contract_file is None else (self.source_path.parent / self.contract_file).resolve()

    def cells(self) -> list[CellKey]:
        return [CellKey(op=o, profile=p, layout=lay)
                for p in self.profiles for o in self.ops for lay in self.layouts]

    def behaviour_of(self, key: CellKey) -> str:
        for pattern, what in self.behaviour.items():
            if fnmatchcase(key.id, pattern):
                return what
        return "green"


def load_manifest(path: str | Path, allow_plugins: bool = False) -> FakeManifest:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise ValueError(f"manifest {path}: malformed YAML; fix the syntax") from None
    if not isinstance(data, dict) or "name" not in data:
        raise ValueError(f"manifest {path}: field 'name' is required")
    profiles = {name: FakeProfile(env=dict((spec or {}).get("env", {})), device=(spec or {}).get("device", "cpu"))
                for name, spec in data.get("profiles", {}).items()}
    return FakeManifest(name=data["name"], manifest_version=int(data.get("manifest_version", 1)),
                        contract_version=str(data.get("contract_version", "fake-1")), ops=list(data["ops"]),
                        layouts=list(data["layouts"]), profiles=profiles,
                        behaviour=dict(data.get("behaviour") or {}), source_path=path.resolve(),
                        cell_timeout_s=data.get("cell_timeout_s"), reruns=int(data.get("reruns", 1)),
                        contract_file=data.get("contract_file"))
