"""The backend families, written once: their names and where each kernel family keeps its modules.

A family's kernel modules share one public API per op (``gradsweep.triton_kernels.<module>`` and
``gradsweep.cuda_kernels.<module>``), so an op's kernel candidates follow from the files that exist:
``<family>.<op>`` is declared for every family whose package holds the op's module. Existence is read from
the file system, never by importing: a worker sets ``TRITON_INTERPRET`` before the first kernel import.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from types import ModuleType
from typing import Literal, get_args

Family = Literal["torch", "triton", "cuda"]
FAMILIES: tuple[Family, ...] = get_args(Family)
STOCK_FAMILY: Family = "torch"  # stock PyTorch: the status quo, every op's ``torch.<op>`` candidate
# Each kernel family's package (a directory of one module per op, beside this file).
KERNEL_PACKAGES: dict[Family, str] = {"triton": "triton_kernels", "cuda": "cuda_kernels"}
KERNEL_FAMILIES: tuple[Family, ...] = tuple(KERNEL_PACKAGES)
_ROOT = Path(__file__).resolve().parent


def impl_id(family: str, op: str) -> str:
    """The id of a family's implementation of an op (``triton.rms_norm``); a manifest's default candidate."""
    return f"{family}.{op}"


def has_kernel_module(family: Family, module: str) -> bool:
    """Whether the family ships ``module`` (its file exists; nothing is imported)."""
    return (_ROOT / KERNEL_PACKAGES[family] / f"{module}.py").is_file()


def kernel_families(module: str) -> tuple[Family, ...]:
    """The kernel families that ship ``module``, in declaration order."""
    return tuple(fam for fam in KERNEL_FAMILIES if has_kernel_module(fam, module))


_LOADED: dict[tuple[str, str], ModuleType] = {}


def kernel_module(family: str, module: str) -> ModuleType:
    """Import a family's kernel module lazily (inside the worker, after its env is set); never another family's.

    Kept once imported: every op call asks for its module, and ``import_module`` costs a few us of host time a
    call even for a loaded module (what a small launch is bound by)."""
    loaded = _LOADED.get((family, module))
    if loaded is not None:
        return loaded
    if family not in KERNEL_PACKAGES:
        raise ValueError(f"family {family!r}: use one of {', '.join(KERNEL_FAMILIES)} "
                         f"(or {STOCK_FAMILY!r} for stock ops)")
    loaded = _LOADED[(family, module)] = import_module(f"gradsweep.{KERNEL_PACKAGES[family]}.{module}")  # type: ignore[index]
    return loaded
