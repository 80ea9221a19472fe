"""Dotted references 'package.module:attribute', resolved inside the process that uses them."""

from __future__ import annotations

import importlib
from typing import Any

DEFAULT_CELL_FN = "gradsweep.harness.cell:run_cell"
DEFAULT_LOADER = "gradsweep.manifest:load_manifest"
# Spellings of gradsweep's own harness and loader: anything else is flagged by verify and report.
STOCK_CELL_FNS = frozenset({DEFAULT_CELL_FN, "gradsweep.harness:run_cell"})
STOCK_LOADERS = frozenset({DEFAULT_LOADER})


def resolve(ref: str) -> Any:
    """Import ``module`` and return ``attribute`` of 'module:attribute'."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:attribute', got {ref!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target
