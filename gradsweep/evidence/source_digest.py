"""Content digests: one file (the manifest) and the source tree (csrc/ and gradsweep/).

The tree digest depends on file paths and contents only (no mtimes, no build products), so two
checkouts of the same sources agree and any edit to a source file changes it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

SOURCE_ROOTS: tuple[str, ...] = ("csrc", "gradsweep")
_SKIP_DIRS = {"__pycache__", "build", "dist", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo", ".so", ".o", ".pyd", ".dll", ".dylib", ".swp"}


@dataclass(frozen=True)
class TreeDigest:
    """sha256 over the sorted (path, content sha256) list; ``files`` counts what was hashed."""

    sha256: str
    files: int
    roots: tuple[str, ...]


def repo_root() -> Path:
    """The checkout that holds the imported gradsweep package."""
    return Path(__file__).resolve().parents[2]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _source_files(root: Path, roots: tuple[str, ...]) -> list[Path]:
    found: list[Path] = []
    for sub in roots:
        base = root / sub
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            rel_parts = path.relative_to(root).parts
            if any(p in _SKIP_DIRS or p.endswith(".egg-info") for p in rel_parts[:-1]):
                continue
            if path.is_file() and not path.is_symlink() and path.suffix not in _SKIP_SUFFIXES:
                found.append(path)
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def tree_digest(root: Path | None = None, roots: tuple[str, ...] = SOURCE_ROOTS) -> TreeDigest:
    """Digest of every source file under ``root/<roots>``; path and content both count."""
    root = (root or repo_root()).resolve()
    outer = hashlib.sha256()
    files = _source_files(root, roots)
    for path in files:
        rel = path.relative_to(root).as_posix()
        outer.update(rel.encode() + b"\0" + file_sha256(path).encode() + b"\n")
    return TreeDigest(sha256=outer.hexdigest(), files=len(files), roots=roots)
