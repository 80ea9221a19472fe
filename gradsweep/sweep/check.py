"""``gradsweep check``: one cell, in this process, with every per-tensor diagnostic.

The profile's environment is applied before the manifest (and so the harness) is imported: it is
read from the raw YAML first, since the manifest loader itself may import kernels, and it passes the
same allowlist as a loaded manifest's (gradsweep.env_policy) before anything is applied.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gradsweep.env_policy import raw_profile_env
from gradsweep.errors import BadInput, one_line
from gradsweep.evidence.predicate import CellRecord
from gradsweep.resolve import DEFAULT_CELL_FN, DEFAULT_LOADER, resolve
from gradsweep.results import CellKey
from gradsweep.sweep.manifest_info import default_manifest_path, load_info
from gradsweep.sweep.memory import FreeMemory, check_memory, measured_free
from gradsweep.sweep.placement import visible_gpus
from gradsweep.sweep.tally import tally, verdict
from gradsweep.sweep.worker import run_one, with_reruns
from gradsweep.tracked_reds import default_tracked_path, load_tracked, match_entry


def _check_candidate(manifest: Any, key: CellKey, candidate: str) -> None:
    """--candidate must name an implementation of the op in the profile's family (a profile never borrows)."""
    from gradsweep.manifest import Manifest
    from gradsweep.ops.registry import get_op

    if not isinstance(manifest, Manifest):
        return
    cands = get_op(key.op).candidates
    if candidate not in cands:
        raise BadInput(f"--candidate {candidate!r}: not an implementation of {key.op} "
                       f"(known: {', '.join(sorted(cands))})")
    family = manifest.profiles[key.profile].family
    if cands[candidate].family != family:
        raise BadInput(f"--candidate {candidate!r}: a {cands[candidate].family} implementation; profile "
                       f"{key.profile} is {family} and never borrows another family's implementation")


def check_cell(manifest: Path | None, op: str, profile: str, layout: str, candidate: str | None = None,
               cell_fn: str = DEFAULT_CELL_FN, loader: str = DEFAULT_LOADER, reruns: int | None = None,
               allow_plugins: bool = False, free_memory: FreeMemory = measured_free) -> tuple[CellRecord, int]:
    """Run one cell in-process; returns its record (tracked mark applied) and the exit code."""
    if reruns is not None and reruns < 1:
        raise BadInput(f"--reruns {reruns}: must be at least 1")
    path = Path(manifest) if manifest is not None else default_manifest_path()
    if path.is_file():
        os.environ.update(raw_profile_env(path, profile))
    info = load_info(path, loader, allow_plugins)
    key = CellKey(op=op, profile=profile, layout=layout)
    if key not in info.cells:
        known = {"op": {c.op for c in info.cells}, "profile": {c.profile for c in info.cells},
                 "layout": {c.layout for c in info.cells}}
        for kind, name in (("op", op), ("profile", profile), ("layout", layout)):
            if name not in known[kind]:
                raise BadInput(f"unknown {kind} {name!r} (known: {', '.join(sorted(known[kind]))})")
        raise BadInput(f"cell {key.id} is not in the manifest (the op does not run in that layout)")
    os.environ.update(info.profile_env.get(profile, {}))
    if candidate is not None:
        _check_candidate(info.manifest, key, candidate)
    check_memory(info.manifest, [key], gpus_visible=bool(visible_gpus()), free=free_memory)
    try:
        fn: Any = resolve(cell_fn)
    except (ImportError, AttributeError, ValueError) as exc:
        raise BadInput(f"cell function {cell_fn!r}: cannot import ({one_line(exc)})") from None
    if candidate is not None:
        if "candidate" not in inspect.signature(fn).parameters:
            raise BadInput(f"--candidate: the cell function {cell_fn} does not take a candidate")
        base = fn

        def fn(m: Any, k: CellKey) -> Any:
            return base(m, k, candidate=candidate)
    try:
        manifest_run = with_reruns(info.manifest, reruns)
    except TypeError as exc:
        raise BadInput(f"--reruns: {exc}") from None
    result = run_one(fn, manifest_run, key, show_traceback=False)
    tracked_path = default_tracked_path(info.path)
    entries = load_tracked(tracked_path) if tracked_path.is_file() else []
    rec = CellRecord(result=result, tracked=match_entry(entries, result))
    counts, _ = tally([rec], [])
    return rec, verdict(counts, strict=False).exit_code


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3e}"
    return str(value)


def render_check(rec: CellRecord, console: Console) -> None:
    res = rec.result
    console.print(f"[bold]{res.key.id}[/]: {res.status.value}"
                  + (" (tracked)" if rec.tracked else " (UNTRACKED)" if rec.untracked_red else ""))
    for label, value in (("candidate", res.candidate), ("reason", res.reason),
                         ("first failure", res.first_failure), ("shape", res.shape or None),
                         ("duration", f"{res.duration_s:.3f} s")):
        if value:
            console.print(f"  {label}: {value}", markup=False)
    if rec.tracked:
        console.print(f"  tracked: {rec.tracked.reason} (fix: {rec.tracked.fix})", markup=False)
    if not res.tensors:
        return
    table = Table(title="per-tensor diagnostics")
    columns = ["name", "kind", "invariance_check", "bitwise_equal", "mismatched_elements", "max_abs",
               "max_rel", "accuracy_error", "stock_error", "accuracy_bound", "accuracy_ok"]
    for col in columns:
        table.add_column(col)
    for metric in res.tensors:
        table.add_row(*(_fmt(getattr(metric, col)) for col in columns))
    console.print(table)
