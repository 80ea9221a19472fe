"""Dotted references 'package.module:attribute', resolved inside the process that uses them."""

from __future__ import annotations

import importlib
from typing import Any

DEFAULT_CELL_FN = "gradsweep.harness:run_cell"
DEFAULT_LOADER = "gradsweep.manifest:load_manifest"


def resolve(ref: str) -> Any:
    """Import ``module`` and return ``attribute`` of 'module:attribute'."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected 'module:attribute', got {ref!r}")
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target
