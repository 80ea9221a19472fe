"""The built CUDA extension (gradsweep/_C*.so): which file the workers import, and its digest.

The extension is a build product, not a source (the tree digest skips it), but the cuda_bf16
verdicts are verdicts about that binary: evidence records its digest and build facts, and
``verify`` compares the digest with this checkout's build, when it has one.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from gradsweep.evidence.source_digest import file_sha256

EXTENSION_STEM = "gradsweep/_C"


def find_extension(root: Path) -> Path | None:
    """The extension this interpreter would import from ``root``'s gradsweep/, in import order."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = root / f"{EXTENSION_STEM}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def extension_digest(root: Path) -> tuple[Path, str] | None:
    """(path, sha256) of the built extension under ``root``, or None when it is not built there."""
    path = find_extension(root)
    return None if path is None else (path, file_sha256(path))
