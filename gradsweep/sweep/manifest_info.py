"""What the sweep needs from a manifest, loaded in the parent through a replaceable loader.

The loader is a dotted reference (default gradsweep.manifest:load_manifest) so tests can plant a
tiny fake; workers load the same file with the same loader themselves. Whatever the loader, its manifest
provides: name, manifest_version, cells(), profiles (each with env and device), contract_path (or None),
contract_version, cell_timeout_s (or None), reruns and plugins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradsweep.env_policy import check_profile_env
from gradsweep.errors import BadInput, one_line
from gradsweep.evidence.predicate import ContractRef
from gradsweep.evidence.source_digest import file_sha256
from gradsweep.resolve import DEFAULT_LOADER, resolve
from gradsweep.results import CellKey
from gradsweep.sweep.worker import load_with


@dataclass(frozen=True)
class ManifestInfo:
    path: Path
    name: str
    version: int
    sha256: str
    cells: list[CellKey]
    profile_env: dict[str, dict[str, str]]
    profile_device: dict[str, str]
    contract: ContractRef
    contract_path: Path | None
    cell_timeout_s: float | None
    reruns: int
    plugins: list[str]
    manifest: Any


def default_manifest_path() -> Path:
    from gradsweep.manifest import DEFAULT_MANIFEST

    return Path(DEFAULT_MANIFEST)


def _contract(manifest: Any) -> tuple[ContractRef, Path | None]:
    """The contract's version, and its file (None when the loader's manifest names none)."""
    path = Path(manifest.contract_path) if manifest.contract_path is not None else None
    try:
        version = str(manifest.contract_version)  # a gradsweep manifest reads its contract file here
    except ValueError as exc:
        raise BadInput(one_line(exc)) from None
    if path is not None and not path.is_file():
        raise BadInput(f"contract {path}: no such file")
    return ContractRef(version=version, sha256=file_sha256(path) if path else None), path


def load_info(path: Path | None, loader: str = DEFAULT_LOADER, allow_plugins: bool = False) -> ManifestInfo:
    """Load and summarise a manifest; every problem with the file is BadInput (one line)."""
    path = Path(path) if path is not None else default_manifest_path()
    if not path.exists():
        raise BadInput(f"manifest {path}: no such file")
    if path.is_dir():
        raise BadInput(f"manifest {path}: is a directory; pass a YAML file")
    try:
        load = resolve(loader)
    except (ImportError, AttributeError, ValueError) as exc:
        raise BadInput(f"manifest loader {loader!r}: cannot import ({one_line(exc)})") from None
    try:
        manifest = load_with(load, str(path), allow_plugins)
    except ValueError as exc:
        raise BadInput(one_line(exc)) from None
    for name, spec in manifest.profiles.items():  # whatever the loader, a manifest stays data
        try:
            check_profile_env(dict(spec.env))
        except ValueError as exc:
            raise BadInput(f"manifest {path}: field 'profiles.{name}.env': {exc}") from None
    timeout = manifest.cell_timeout_s
    contract, contract_path = _contract(manifest)
    return ManifestInfo(
        path=path.resolve(), name=str(manifest.name), version=int(manifest.manifest_version),
        sha256=file_sha256(path), cells=list(manifest.cells()),
        profile_env={name: dict(spec.env) for name, spec in manifest.profiles.items()},
        profile_device={name: str(spec.device) for name, spec in manifest.profiles.items()},
        contract=contract, contract_path=contract_path,
        cell_timeout_s=float(timeout) if timeout else None, reruns=int(manifest.reruns),
        plugins=list(manifest.plugins), manifest=manifest)
