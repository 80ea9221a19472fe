"""What ``gradsweep drift`` does, as a function: validate the request, run the plan, write and render the outputs.

Bad input is a one-line ``BadInput`` naming the option and the fix. The profiles' environments (e.g.
``TRITON_INTERPRET=1``) are applied before any kernel is imported, so profiles whose environments disagree
cannot share a run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gradsweep.env_policy import raw_profile_env
from gradsweep.errors import BadInput


@dataclass
class DriftRequest:
    manifest: Path | None
    profiles: list[str]
    train: str = "bn_full"
    infer: str = "decode"
    infer_profile: str | None = None  # a cross-backend pair: each profile's train role vs this profile's infer role
    layers: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    out: Path | None = None
    key: Path | None = None
    dlogp: bool = True
    rl: bool = True
    reruns: int = 1
    allow_plugins: bool = False


def _apply_env(path: Path, profiles: list[str]) -> None:
    merged: dict[str, str] = {}
    for name in profiles:
        for k, v in raw_profile_env(path, name).items():
            if merged.get(k, v) != v:
                raise BadInput(f"--profile: {name} sets {k}={v} but another profile of this run sets {k}="
                               f"{merged[k]}; drift them in separate runs")
            merged[k] = v
    os.environ.update(merged)  # before any kernel is imported (allowlisted names only)


def build_plan(req: DriftRequest):
    """Load the manifest and turn the request into a DriftPlan (every check a one-line BadInput)."""
    from gradsweep.manifest import DEFAULT_MANIFEST, ManifestError, load_manifest

    path = Path(req.manifest) if req.manifest is not None else DEFAULT_MANIFEST
    names = list(dict.fromkeys(req.profiles + ([req.infer_profile] if req.infer_profile else [])))
    if path.is_file():
        _apply_env(path, names)
    from gradsweep.drift import DriftPlan, Pair, Role
    from gradsweep.nn.qwen3 import Qwen3Shape

    try:
        m = load_manifest(path, allow_plugins=req.allow_plugins)
    except ManifestError as exc:
        raise BadInput(str(exc)) from None
    for name in names:
        if name not in m.profiles:
            raise BadInput(f"--profile: unknown profile {name!r} (known: {', '.join(m.profiles)})")
    for flag, lay in (("--train", req.train), ("--infer", req.infer)):
        if lay not in m.layouts:
            raise BadInput(f"{flag}: {lay!r} is not a layout of {path} (known: {', '.join(m.layouts)})")
    if req.reruns < 0:
        raise BadInput("--reruns must be 0 or more")
    shape = dict(m.ops["chain"].shape) if "chain" in m.ops else {}
    for field, value in (("layers", req.layers), ("hidden", req.hidden), ("intermediate", req.intermediate),
                         ("vocab", req.vocab)):
        if value is not None:
            if value <= 0:
                raise BadInput(f"--{field} must be positive")
            shape[field] = value
    try:
        chain_shape = Qwen3Shape(**shape)
    except ValueError as exc:
        raise BadInput(f"chain shape: {' '.join(str(exc).split())}") from None
    if req.infer_profile:
        pairs = [Pair(Role(p, req.train), Role(req.infer_profile, req.infer)) for p in req.profiles]
    else:
        pairs = [Pair(Role(p, req.train), Role(p, req.infer)) for p in req.profiles]
    return DriftPlan(m, chain_shape, pairs, dlogp=req.dlogp, rl=req.rl, reruns=req.reruns)


def exit_code(report: dict) -> int:
    """1 when a bitwise pair's bits differ, a parity side is outside the contract, a role crashed, or a profile
    that advertises deterministic logp did not repeat; else 0 (drift is measured, not expected: the code says
    only that it was found)."""
    for p in report["pairs"]:
        if p["status"] == "error":
            return 1
        if p["status"] != "compared":
            continue
        if p["claim"] == "bitwise" and p["first_difference"] is not None:
            return 1
        if p.get("parity") and p["parity"].get("ok") is False:
            return 1
    if any(r.get("ok") is False for r in report["repeatability"]):
        return 1
    return 0


def run_request(req: DriftRequest, say: Callable[[str], None] = lambda s: None) -> tuple[dict, dict[str, Path]]:
    """Run the plan, then write the outputs under ``req.out`` (JSON, table, plot, signed evidence) when given."""
    from gradsweep.drift import run_drift_plan
    from gradsweep.drift.outputs import write_outputs

    plan = build_plan(req)
    report = run_drift_plan(plan, say)
    written = write_outputs(report, req.out, req.key, sign=True, say=say) if req.out is not None else {}
    return report, written


def run_and_render(req: DriftRequest, as_json: bool, say: Callable[[str], None] = lambda s: None
                   ) -> tuple[dict, str, int]:
    """``gradsweep drift``: (report, text to print, exit code); BadInput for bad options."""
    from gradsweep.drift.outputs import table_text
    from gradsweep.drift.report import to_json

    report, written = run_request(req, say)
    for kind, path in written.items():
        say(f"wrote {kind}: {path}")
    return report, to_json(report) if as_json else table_text(report), exit_code(report)
