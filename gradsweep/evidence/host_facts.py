"""CPU model and BLAS of the host: the Triton interpreter's dot and stock CPU torch go through them.

Every probe is best effort: a fact that cannot be queried is None, never guessed, and no probe may
fail the sweep (numpy, threadpoolctl or torch may be missing, or report in another shape).
"""

from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Any


def cpu_model() -> str | None:
    """'model name' of /proc/cpuinfo (Linux), else platform.processor(), else None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Processor") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _numpy_blas() -> dict[str, Any]:
    try:
        import numpy

        config = numpy.show_config(mode="dicts")  # numpy >= 1.25
        blas = config["Build Dependencies"]["blas"]
    except Exception:  # any numpy version or layout: the fact is simply unknown
        return {}
    return {"numpy_blas": blas.get("name"), "numpy_blas_version": blas.get("version")}


def _threadpool_blas() -> dict[str, Any]:
    """threadpoolctl (if installed) knows the BLAS loaded at run time and its core type."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return {}
    try:
        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    except Exception:
        return {}
    if not pools:
        return {}
    first = pools[0]
    return {"runtime_blas": first.get("internal_api"), "runtime_blas_version": first.get("version"),
            "blas_core_type": first.get("architecture")}


def _torch_blas() -> dict[str, Any]:
    """torch's build settings name its BLAS; its CPU capability is the kernel family it dispatches to."""
    try:
        import torch

        shown = torch.__config__.show()
    except Exception:
        return {}
    facts: dict[str, Any] = {}
    for key in ("BLAS_INFO", "LAPACK_INFO"):
        found = re.search(rf"\b{key}=([^,\s]+)", shown)
        if found:
            facts[f"torch_{key.lower()}"] = found.group(1)
    try:
        facts["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except Exception:
        pass
    return facts


def blas_facts() -> dict[str, Any] | None:
    """The BLAS numpy was built with, the one loaded at run time, and torch's; None if none is known."""
    facts = {**_numpy_blas(), **_threadpool_blas(), **_torch_blas()}
    facts = {k: (v if v is None or isinstance(v, (str, int, float, bool)) else str(v)) for k, v in facts.items()}
    return facts or None
