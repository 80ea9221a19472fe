"""Refuse shapes that cannot fit the device before any cell runs (one line, exit 2).

The estimate is generic, read from the op's declarations only (never a special case): every
declared per-token input and output (feature shape x the manifest's logical tokens) and every
parameter, at FP64_BYTES per element (the FP64 reference is the widest copy the harness holds), times
SAFETY (each tensor also has a gradient). It is a lower bound of what a cell allocates, so it refuses
only shapes that cannot possibly fit; it is compared with the memory free on the device the cell's
profile runs on (``torch.cuda.mem_get_info`` of the visible GPUs, the host's available memory for CPU
profiles).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gradsweep.errors import BadInput
from gradsweep.results import CellKey

FP64_BYTES = 8
SAFETY = 2
HOST = "host"
GPU = "gpu"

FreeMemory = Callable[[str], int | None]


@dataclass(frozen=True)
class Estimate:
    op: str
    bytes: int
    tokens: int
    field: str | None  # the shape field with the largest value: the one to reduce


def _prod(dims: Iterable[int]) -> int:
    return math.prod(int(d) for d in dims)


def estimate_op(op_name: str, shape: dict[str, Any], tokens: int) -> Estimate:
    """Lower-bound bytes of one cell of ``op_name`` at ``shape`` over ``tokens`` logical tokens."""
    from gradsweep.ops.registry import get_op

    op = get_op(op_name)
    elements = sum(tokens * _prod(t.feature(shape)) for t in op.inputs)
    elements += sum(tokens * _prod(o.feature(shape)) for o in op.outputs)
    elements += sum(_prod(p.shape(shape)) for p in op.params)
    numeric = {k: v for k, v in shape.items() if isinstance(v, int) and not isinstance(v, bool)}
    field = max(numeric, key=lambda k: numeric[k]) if numeric else None
    return Estimate(op=op_name, bytes=elements * FP64_BYTES * SAFETY, tokens=tokens, field=field)


def profile_memory_kind(device: str, gpus_visible: bool) -> str | None:
    """Where a profile's cells allocate: the GPU, the host, or nowhere here (a cuda profile without GPU
    is blocked, not run)."""
    if device == "cpu":
        return HOST
    if device == "cuda":
        return GPU if gpus_visible else None
    return GPU if gpus_visible else HOST


def host_available() -> int | None:
    """MemAvailable of /proc/meminfo, else free physical pages; None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


_GPU_QUERY = ("import json, torch; print(json.dumps([torch.cuda.mem_get_info(i)[0] "
              "for i in range(torch.cuda.device_count())]))")


def gpu_free() -> int | None:
    """The least free memory over the visible GPUs, asked in a throwaway process so the sweep's parent
    never holds a CUDA context; None when unknown."""
    try:
        done = subprocess.run([sys.executable, "-c", _GPU_QUERY], capture_output=True, text=True, timeout=180,
                              check=False)
        free = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return min(free) if free else None


def measured_free(kind: str) -> int | None:
    return gpu_free() if kind == GPU else host_available()


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n < 2**40 else f"{n / 2**40:.1f} TiB"


def check_memory(manifest: Any, cells: list[CellKey], gpus_visible: bool,
                 free: FreeMemory = measured_free) -> None:
    """Raise BadInput naming the op and shape field of the first op that cannot fit its device.

    Only gradsweep manifests (ops with declared shapes) are checked; only cells whose profile declares a
    runnable candidate count. ``free(kind)`` is asked once per kind; None skips the check.
    """
    from gradsweep.manifest import Manifest

    if not isinstance(manifest, Manifest):
        return
    tokens = sum(manifest.samples.lengths)
    needed: dict[tuple[str, str], Estimate] = {}
    for key in cells:
        prof = manifest.profiles[key.profile]
        decl = prof.candidates.get(key.op)
        if decl is None or decl.impl is None or decl.status.value not in ("required", "optional"):
            continue
        kind = profile_memory_kind(prof.device, gpus_visible)
        if kind is not None and (key.op, kind) not in needed:
            needed[(key.op, kind)] = estimate_op(key.op, manifest.shape(key.op), tokens)
    known: dict[str, int | None] = {}
    for (op_name, kind), est in sorted(needed.items(), key=lambda kv: -kv[1].bytes):
        if kind not in known:
            known[kind] = free(kind)
        have = known[kind]
        if have is not None and est.bytes > have:
            where = "the GPU" if kind == GPU else "this host"
            field = f".{est.field}" if est.field else ""
            fix = f"; reduce {est.field}" if est.field else ""
            raise BadInput(f"ops.{op_name}.shape{field}: {op_name} needs at least {_gib(est.bytes)} "
                           f"({est.tokens} tokens, every declared tensor in fp64 x{SAFETY}) but {where} has "
                           f"{_gib(have)} free{fix}")
