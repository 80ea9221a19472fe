"""The built modules (gradsweep/_C*.so, gradsweep/_fold_plan*.so): which files the workers import, and their digests.

They are build products, not sources (the tree digest skips them), but verdicts and figures are about those
binaries: the cuda_bf16 cells run the CUDA extension, and every canonical fold is planned by the compiled fold
planner where one is built (numpy where not: the same plans by test, at another host cost). Evidence records the
digest of each (the extension's build facts too), and ``verify`` compares them with this checkout's builds, when
it has them.
"""

from __future__ import annotations

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from gradsweep.evidence.source_digest import file_sha256

EXTENSION_STEM = "gradsweep/_C"
PLANNER_STEM = "gradsweep/_fold_plan"


def find_extension(root: Path, stem: str = EXTENSION_STEM) -> Path | None:
    """The module ``stem`` this interpreter would import from ``root``'s gradsweep/, in import order."""
    for suffix in EXTENSION_SUFFIXES:
        candidate = root / f"{stem}{suffix}"
        if candidate.is_file():
            return candidate
    return None


def extension_digest(root: Path, stem: str = EXTENSION_STEM) -> tuple[Path, str] | None:
    """(path, sha256) of the built module ``stem`` (default: the CUDA extension) under ``root``, or None when it
    is not built there."""
    path = find_extension(root, stem)
    return None if path is None else (path, file_sha256(path))


def planner_digest(root: Path) -> tuple[Path, str] | None:
    """(path, sha256) of the compiled fold planner under ``root``, or None (folds then plan in numpy)."""
    return extension_digest(root, PLANNER_STEM)
