"""What the sweep needs from a manifest, loaded in the parent through a replaceable loader.

The loader is a dotted reference (default gradsweep.manifest:load_manifest) so tests can plant a
tiny fake; workers load the same file with the same loader themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradsweep.evidence.predicate import ContractRef
from gradsweep.evidence.source_digest import file_sha256
from gradsweep.results import CellKey
from gradsweep.sweep.errors import BadInput, one_line
from gradsweep.sweep.resolve import DEFAULT_LOADER, resolve


@dataclass(frozen=True)
class ManifestInfo:
    path: Path
    name: str
    version: int
    sha256: str
    cells: list[CellKey]
    profile_env: dict[str, dict[str, str]]
    contract: ContractRef
    cell_timeout_s: float | None
    manifest: Any


def default_manifest_path() -> Path:
    from gradsweep.manifest import DEFAULT_MANIFEST

    return Path(DEFAULT_MANIFEST)


def _contract(manifest: Any) -> ContractRef:
    if hasattr(manifest, "contract_version"):  # test fakes declare it directly
        return ContractRef(version=str(manifest.contract_version), path=None)
    path = Path(manifest.contract_path)
    from gradsweep.contract import load_contract

    try:
        return ContractRef(version=str(load_contract(path).version), path=str(path))
    except ValueError as exc:
        raise BadInput(one_line(exc)) from None


def load_info(path: Path | None, loader: str = DEFAULT_LOADER) -> ManifestInfo:
    """Load and summarise a manifest; every problem with the file is BadInput (one line)."""
    path = Path(path) if path is not None else default_manifest_path()
    if not path.exists():
        raise BadInput(f"manifest {path}: no such file")
    if path.is_dir():
        raise BadInput(f"manifest {path}: is a directory; pass a YAML file")
    try:
        manifest = resolve(loader)(path)
    except ValueError as exc:
        raise BadInput(one_line(exc)) from None
    timeout = getattr(manifest, "cell_timeout_s", None)
    return ManifestInfo(
        path=path.resolve(), name=str(manifest.name), version=int(manifest.manifest_version),
        sha256=file_sha256(path), cells=list(manifest.cells()),
        profile_env={name: dict(spec.env) for name, spec in manifest.profiles.items()},
        contract=_contract(manifest), cell_timeout_s=float(timeout) if timeout else None, manifest=manifest)
