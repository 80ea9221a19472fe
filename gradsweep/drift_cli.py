"""``gradsweep drift``: resolve a profile's candidates for the default chain, run it, render the report."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from gradsweep.sweep.check import _raw_profile_env
from gradsweep.sweep.errors import BadInput


def run_drift(manifest_path: Path | None, profile: str, train: str, infer: str, hidden: int, inner: int,
              vocab: int, as_json: bool):
    from gradsweep.manifest import DEFAULT_MANIFEST, ManifestError

    path = Path(manifest_path) if manifest_path is not None else DEFAULT_MANIFEST
    if path.is_file():
        os.environ.update(_raw_profile_env(path, profile))  # before any kernel is imported
    from gradsweep.drift import attribute_drift, default_chain
    from gradsweep.harness.cell import workload_of
    from gradsweep.harness.hardware import check_requirements, resolve_device
    from gradsweep.layouts import build_calls
    from gradsweep.manifest import load_manifest
    from gradsweep.ops.registry import get_op

    try:
        m = load_manifest(path)
    except ManifestError as exc:
        raise BadInput(str(exc)) from None
    if profile not in m.profiles:
        raise BadInput(f"--profile: unknown profile {profile!r} (known: {', '.join(m.profiles)})")
    for flag, lay in (("--train", train), ("--infer", infer)):
        if lay not in m.layouts:
            raise BadInput(f"{flag}: {lay!r} is not a layout of {path} (known: {', '.join(m.layouts)})")
    if min(hidden, inner, vocab) <= 0:
        raise BadInput("--hidden, --inner and --vocab must be positive")
    prof = m.profiles[profile]
    blocked = check_requirements(list(prof.requires))
    if blocked is not None:
        raise BadInput(f"profile {profile} cannot run on this box: {blocked[1]}")
    chain = default_chain(hidden, inner, vocab)
    cands = []
    for stage in chain:
        decl = prof.candidates.get(stage.op)
        if decl is None or decl.impl is None:
            raise BadInput(f"profile {profile} has no runnable candidate for {stage.op}; pick another profile")
        cands.append(get_op(stage.op).candidates[decl.impl])
    calls = {lay: build_calls(lay, m.layouts[lay], m.samples.lengths, m.seed) for lay in (train, infer)}
    report = attribute_drift(chain, cands, workload_of(m), (train, calls[train]), (infer, calls[infer]),
                             resolve_device(prof.device))
    if as_json:
        body = {"profile": profile, "train": train, "infer": infer,
                "first_divergence": None if report.first_divergence is None else asdict(report.first_divergence),
                "stages": [asdict(s) for s in report.stages], "growth": report.growth()}
        return report, json.dumps(body, indent=2) + "\n"
    lines = [f"drift {profile}: {train} (train) vs {infer} (inference), {m.samples.lengths} tokens per sample",
             f"{'stage':<6}{'op':<12}{'tensor':<8}{'mismatched':>12}{'max abs':>11}{'mean abs':>11}{'p99 abs':>11}"
             f"{'growth':>9}"]
    for s, g in zip(report.stages, report.growth()):
        grow = "-" if g is None else f"{g:.3g}x"
        lines.append(f"{s.stage:<6}{s.op:<12}{s.tensor:<8}{f'{s.mismatched}/{s.numel}':>12}{s.max_abs:>11.3g}"
                     f"{s.mean_abs:>11.3g}{s.p99_abs:>11.3g}{grow:>9}")
    first = report.first_divergence
    lines.append("no drift: every stage is bitwise equal" if first is None else
                 f"drift enters at stage {first.stage} ({first.op}.{first.tensor})")
    return report, "\n".join(lines) + "\n"
