"""The bench steps a device probe walks (scripts/host_probe.py, scripts/graph_probe.py): each selected bench case
of a manifest at its own shapes and layouts, with every family's step and the stock step, as ``gradsweep bench``
builds them. Diagnostics only: nothing here times or signs anything."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gradsweep.bench.baselines import Reference
from gradsweep.bench.cases import Case
from gradsweep.bench.catalog import RUNNERS
from gradsweep.bench.subjects import OpSubject
from gradsweep.bench.suite import select
from gradsweep.manifest import load_manifest
from gradsweep.ops.registry import get_op


@dataclass
class CaseSteps:
    """One case's steps: ``refs`` holds (family or "stock", its Reference) for the case's training mode."""

    case: Case
    mode: str
    refs: list[tuple[str, Reference]]


def case_steps(manifest: str, ops: Sequence[str], case_filters: Sequence[str],
               device: torch.device, exact: bool = False) -> Iterator[CaseSteps | tuple[Case, Exception]]:
    """Each selected op case (host-only cases skipped; ``case_filters``: ids containing one of them, or with
    ``exact`` ids equal to one: ``det_gemm/dx_m1`` alone, not ``dx_m16``), or (case, exception) when its data or
    subject could not be built (nothing is built for a case the filters leave out). The device's cache is emptied
    between cases."""
    sel = select(load_manifest(manifest), list(ops) or None, None, False, "cuda")
    for case in sel.cases:
        wanted = case.id in case_filters if exact else any(c in case.id for c in case_filters)
        if case.host_only or (case_filters and not wanted):
            continue
        mode = {"bwd": "fwd_bwd"}.get(case.phase, case.phase)
        slots = {s.family: s.candidate for s in sel.slots[case.id] if s.candidate is not None}
        try:
            subject = RUNNERS.get(case.runner, OpSubject)(case, get_op(case.op), slots, device, 0)
        except Exception as exc:  # the probe reports it and goes on
            yield case, exc
            continue
        refs = [(family, subject.family(family, mode)) for family in slots]
        stock = subject.reference("stock", mode)
        if stock is not None:
            refs.append(("stock", stock))
        yield CaseSteps(case, mode, refs)
        del subject, refs
        torch.cuda.empty_cache()


def training_steps(manifest: str, ops: Sequence[str], case_filters: Sequence[str], device: torch.device,
                   say: Callable[[str], None]) -> Iterator[CaseSteps]:
    """``case_steps``' training-step cases (mode ``fwd_bwd``); a case whose steps could not be built is said and
    skipped."""
    for item in case_steps(manifest, ops, case_filters, device):
        if isinstance(item, tuple):
            say(f"{item[0].id}: not built: {item[1]!r}")
        elif item.mode == "fwd_bwd":
            yield item


def log_to(out: Path, name: str) -> Callable[[str], None]:
    """A ``say(text)`` that prints a probe's line and appends it to ``out/name`` (made if missing), flushed at once:
    a device call cut by its time limit still brings back every line written so far."""
    out.mkdir(parents=True, exist_ok=True)
    log = (out / name).open("a")

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()
    return say


def probe_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every bench-case probe takes: OUT, the manifest, the ops and the case filters."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("out", type=Path)
    ap.add_argument("--manifest", default="manifests/h200.yaml")
    ap.add_argument("--op", action="append", default=[], help="ops whose bench cases are probed")
    ap.add_argument("--case", action="append", default=[], help="only cases whose id contains one of these")
    return ap


def back_to_back(step: Callable[[], None], seconds: float, host: list[float] | None = None) -> list[float]:
    """Device us per step of steps issued back to back for ``seconds``: one event pair per 20 steps, the device
    drained between chunks (as the bench's samples are), so a host-bound step reads its host's pace. ``host``,
    when given, gets each step's host seconds."""
    out: list[float] = []
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(20):
            t0 = time.perf_counter()
            step()
            if host is not None:
                host.append(time.perf_counter() - t0)
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 20 * 1e3)
    return out
