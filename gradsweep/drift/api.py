"""Run a drift plan: every role once, every pair boundary by boundary, attribution, RL fragments, repeatability.

The result is a plain JSON-able dict (``schema: gradsweep.drift/v1``); ``report.py`` renders it, ``plot.py``
draws it and ``evidence.py`` signs it. Nothing here expects drift or its absence: every number is measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from gradsweep.contract import CheckKind, Contract, load_contract
from gradsweep.drift.metrics import LogpEffect, growth, logp_effect, tensor_drift
from gradsweep.drift.plan import BITWISE, Pair, ProfileState, Role, profile_state
from gradsweep.drift.rl import RL_FRAGMENTS, fragment_candidate, fragment_shape, run_fragment, trainer_view
from gradsweep.drift.runner import ChainSetup, RoleRun, draw_weights, run_role
from gradsweep.harness.compare import normwise_error
from gradsweep.harness.execute import exact_fp32
from gradsweep.layouts import REFERENCE_LAYOUT, build_calls
from gradsweep.manifest import Manifest
from gradsweep.nn.qwen3 import Qwen3Shape, reference_logp
from gradsweep.ops.registry import get_op
from gradsweep.workload import Workload

SCHEMA = "gradsweep.drift/v1"


@dataclass
class DriftPlan:
    """Pairs to compare over one manifest's samples, at one chain shape."""

    manifest: Manifest
    shape: Qwen3Shape
    pairs: list[Pair]
    dlogp: bool = True  # attribute the final logp difference to each differing boundary (one re-run each)
    rl: bool = True  # the RL loss fragments as the last boundaries
    reruns: int = 1  # repeatability re-runs of each role, for profiles that advertise deterministic logp
    reference: bool | None = None  # FP64 reference for parity pairs (None: when a parity pair exists)
    contract: Contract | None = None
    profiles: dict[str, ProfileState] = field(default_factory=dict)


def _unsupported_boundaries(setup_boundaries, state: ProfileState, role: str) -> list[dict]:
    out = []
    for b in setup_boundaries:
        why = state.ops.get(b.op) or f"not run: {state.reason}"
        out.append({"name": b.name, "layer": b.layer, "op": b.op, "status": "unsupported", "role": role,
                    "reason": why})
    return out


class _Runs:
    """Each role runs once (cached); substitution and repeatability re-runs on demand."""

    def __init__(self, plan: DriftPlan, setup: ChainSetup, workload: Workload, say: Callable[[str], None]) -> None:
        self.plan, self.setup, self.workload, self.say = plan, setup, workload, say
        self.cache: dict[Role, RoleRun] = {}
        self.calls_cache: dict[str, list] = {}

    def calls(self, layout: str) -> list:
        if layout not in self.calls_cache:
            m = self.plan.manifest
            self.calls_cache[layout] = build_calls(layout, m.layouts.get(layout), list(m.samples.lengths), m.seed)
        return self.calls_cache[layout]

    def family(self, role: Role) -> str:
        return self.plan.profiles[role.profile].family

    def get(self, role: Role) -> RoleRun:
        if role not in self.cache:
            run = run_role(self.setup, self.family(role), role.layout, self.calls(role.layout))
            self.say(f"  ran {role.label} ({run.calls} calls, {run.seconds:.2f} s)")
            self.cache[role] = run
        return self.cache[role]

    def substituted(self, role: Role, boundary: str, tensor: Tensor) -> Tensor:
        return run_role(self.setup, self.family(role), role.layout, self.calls(role.layout), capture=False,
                        substitute=(boundary, tensor)).logp


def _compare_pair(plan: DriftPlan, runs: _Runs, pair: Pair, active: Tensor) -> dict:
    setup = runs.setup
    started = time.perf_counter()
    out: dict = {"id": pair.label, "claim": pair.claim,
                 "train": {"profile": pair.train.profile, "layout": pair.train.layout},
                 "infer": {"profile": pair.infer.profile, "layout": pair.infer.layout}}
    for key, role in (("train", pair.train), ("infer", pair.infer)):
        state = plan.profiles[role.profile]
        out[key]["family"] = state.family
        if not state.runnable:
            out.update(status="unsupported", role=key, reason=f"{role.profile}: {state.reason}",
                       first_difference=None, boundaries=_unsupported_boundaries(setup.boundaries, state, key),
                       layers=[], rl=[], logp_active=None, trainer_view=None, parity=None)
            return out
    try:
        t_run, i_run = runs.get(pair.train), runs.get(pair.infer)
    except Exception as exc:  # a crashing role is reported, never silently dropped
        out.update(status="error", role="", reason=f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500],
                   first_difference=None, boundaries=[], layers=[], rl=[], logp_active=None, trainer_view=None,
                   parity=None)
        return out
    out["train"].update(calls=t_run.calls, seconds=t_run.seconds)
    out["infer"].update(calls=i_run.calls, seconds=i_run.seconds)
    logp_active = tensor_drift(t_run.logp, i_run.logp, rows=active)
    total_mean = logp_active.mean_abs
    boundaries = []
    for b in setup.boundaries:
        d = tensor_drift(t_run.tensors[b.name], i_run.tensors[b.name])
        entry = {"name": b.name, "layer": b.layer, "op": b.op, "status": "compared",
                 "dtype": str(t_run.tensors[b.name].dtype).removeprefix("torch."), **d.as_dict()}
        if b.name != "logp":
            if d.bitwise_equal:
                effect = LogpEffect(0.0, 0.0, 0.0 if total_mean > 0 else None)
            elif plan.dlogp:
                sub = runs.substituted(pair.train, b.name, i_run.tensors[b.name])
                effect = logp_effect(sub, t_run.logp, total_mean, active)
            else:
                effect = None
            entry["dlogp"] = None if effect is None else effect.as_dict()
        boundaries.append(entry)
    first = next((e["name"] for e in boundaries if e["mismatched"]), None)
    out.update(status="compared", first_difference=first, boundaries=boundaries,
               layers=_layers(boundaries, plan.shape.layers), logp_active=logp_active.as_dict(),
               trainer_view=None, rl=[], parity=None)
    if plan.rl:
        out["rl"] = _rl_fragments(plan, runs, pair, t_run.logp, i_run.logp, active)
        ppo = fragment_shape("rl_ppo", _manifest_shapes(plan.manifest))
        out["trainer_view"] = trainer_view(torch.exp(t_run.logp.double() - i_run.logp.double()), active,
                                           ppo["clip_low"], ppo["clip_high"])
    out["seconds"] = time.perf_counter() - started
    return out


def _layers(boundaries: list[dict], layers: int) -> list[dict]:
    """Per layer: bits and size of the drift, the residual stream's growth from the layer's input."""
    by_name = {e["name"]: e for e in boundaries}
    stream = [by_name["embedding"]] + [by_name[f"L{i}.residual"] for i in range(layers)]
    g_max = growth([e["max_abs"] for e in stream])
    g_mean = growth([e["mean_abs"] for e in stream])
    out = []
    for i in range(layers):
        mine = [e for e in boundaries if e["layer"] == i]
        res = by_name[f"L{i}.residual"]
        out.append({"layer": i, "boundaries": len(mine), "differing": sum(1 for e in mine if e["mismatched"]),
                    "mismatched": sum(e["mismatched"] for e in mine), "max_abs": max(e["max_abs"] for e in mine),
                    "first_difference": next((e["name"] for e in mine if e["mismatched"]), None),
                    "residual_max_abs": res["max_abs"], "residual_mean_abs": res["mean_abs"],
                    "residual_p99_abs": res["p99_abs"], "growth_max": g_max[i + 1], "growth_mean": g_mean[i + 1]})
    return out


def _manifest_shapes(m: Manifest) -> dict[str, dict]:
    return {name: dict(entry.shape) for name, entry in m.ops.items()}


def _rl_fragments(plan: DriftPlan, runs: _Runs, pair: Pair, logp_t: Tensor, logp_i: Tensor,
                  active: Tensor) -> list[dict]:
    shapes = _manifest_shapes(plan.manifest)
    out = []
    for name in RL_FRAGMENTS:
        op = get_op(name)
        shape = fragment_shape(name, shapes)
        sides = {}
        for key, role, policy in (("train", pair.train, logp_t), ("infer", pair.infer, logp_i)):
            state = plan.profiles[role.profile]
            prof = plan.manifest.profiles[role.profile]
            cand, why = fragment_candidate(op, state.family, prof.candidates.get(name))
            sides[key] = (cand, why, policy)
        bad = [(k, why) for k, (cand, why, _) in sides.items() if cand is None]
        if bad:
            for o in [*(o.name for o in op.outputs), "dlogp"]:
                out.append({"fragment": name, "tensor": o, "status": "unsupported", "role": bad[0][0],
                            "reason": bad[0][1]})
            continue
        res = {k: run_fragment(op, cand, shape, runs.workload, policy, logp_i, runs.setup.device)
               for k, (cand, _, policy) in sides.items()}
        for o in [*(o.name for o in op.outputs), "dlogp"]:
            d = tensor_drift(res["train"].tensors[o], res["infer"].tensors[o], rows=active)
            entry = {"fragment": name, "tensor": o, "status": "compared", **d.as_dict()}
            if o in res["train"].values:
                entry.update(train_value=res["train"].values[o], infer_value=res["infer"].values[o])
            out.append(entry)
    return out


def _reference(setup: ChainSetup, workload: Workload) -> Tensor:
    w64 = {k: v.double() for k, v in setup.weights.items()}
    with torch.no_grad():
        return reference_logp(w64, setup.ids, setup.targets, workload.logical_rows(), setup.shape)


def _parity(plan: DriftPlan, runs: _Runs, pairs: list[dict], contract: Contract) -> None:
    """Tolerance-based cross-backend parity: each side's logp against the FP64 reference, bounded by the
    contract's rule for the chain's logp against the stock path's error in the same accumulation class."""
    wanted = [p for p in pairs if p["claim"] != BITWISE and p["status"] == "compared"]
    if not wanted or plan.reference is False:
        return
    ref = _reference(runs.setup, runs.workload)
    stock: dict[str, float] = {}

    def stock_error(klass: str) -> float:
        if klass not in stock:
            calls = runs.calls(REFERENCE_LAYOUT)
            if klass == "fp32":
                with exact_fp32():
                    w32 = {k: v.float() for k, v in runs.setup.weights.items()}
                    lp = run_role(runs.setup, "torch", REFERENCE_LAYOUT, calls, capture=False, weights=w32).logp
            else:
                lp = run_role(runs.setup, "torch", REFERENCE_LAYOUT, calls, capture=False).logp
            stock[klass] = normwise_error(lp, ref)
        return stock[klass]

    for p in wanted:
        sides = {}
        for key in ("train", "infer"):
            role = Role(p[key]["profile"], p[key]["layout"])
            run = runs.get(role)
            family = plan.profiles[role.profile].family
            klass = contract.accumulation_class("chain", "logp", family)
            rule = contract.resolve(CheckKind.FORWARD_ACCURACY, "chain", "logp", "float32", role.profile, klass)
            err = normwise_error(run.logp, ref)
            s_err = stock_error(klass)
            baseline = family == "torch" and role.layout == REFERENCE_LAYOUT and klass == "bf16"
            sides[key] = {"error": err, "stock_error": s_err, "accumulation": klass, "k": rule.k, "floor": rule.floor,
                          "bound": None if baseline else rule.bound(s_err),
                          "ok": None if baseline else err <= rule.bound(s_err),
                          "note": "the stock path itself: reported, not judged" if baseline else ""}
        judged = [s["ok"] for s in sides.values() if s["ok"] is not None]
        p["parity"] = {"claim": "each side's logp within the contract's chain/logp rule of the FP64 reference",
                       "contract_version": contract.version, **sides, "ok": all(judged) if judged else None}


def _repeatability(plan: DriftPlan, runs: _Runs) -> list[dict]:
    """Bitwise reruns of every role of a profile that advertises deterministic logp; no claim for the others."""
    out = []
    for name, state in plan.profiles.items():
        if not state.deterministic_logp:
            out.append({"profile": name, "advertised": False, "checked": False,
                        "note": "deterministic logp not advertised by this profile: no claim made"})
            continue
        if not state.runnable:
            out.append({"profile": name, "advertised": True, "checked": False, "note": state.reason})
            continue
        checks = []
        for role in [r for r in list(runs.cache) if r.profile == name]:
            first_run = runs.cache[role]
            for k in range(plan.reruns):
                try:
                    again = run_role(runs.setup, state.family, role.layout, runs.calls(role.layout))
                except Exception as exc:  # a rerun that crashes did not repeat
                    checks.append({"layout": role.layout, "rerun": k + 1, "ok": False,
                                   "first_difference": f"rerun failed: {type(exc).__name__}: {exc}"[:300]})
                    continue
                diff = next((b for b in first_run.tensors
                             if tensor_drift(first_run.tensors[b], again.tensors[b]).mismatched), None)
                checks.append({"layout": role.layout, "rerun": k + 1, "ok": diff is None, "first_difference": diff})
        out.append({"profile": name, "advertised": True, "checked": bool(checks), "runs": checks,
                    "ok": all(c["ok"] for c in checks) if checks else None})
    return out


def _manifest_path(m: Manifest) -> str | None:
    """Repository-relative (evidence never holds a machine's absolute paths)."""
    from gradsweep.evidence.paths import portable_path
    from gradsweep.evidence.source_digest import repo_root

    try:
        return portable_path(m.source_path, repo_root())
    except ValueError:  # a manifest built in memory
        return None


def run_drift_plan(plan: DriftPlan, say: Callable[[str], None] = lambda s: None) -> dict:
    """Run every pair of the plan and return the report (JSON-able)."""
    started = time.perf_counter()
    m = plan.manifest
    names = sorted({r.profile for p in plan.pairs for r in (p.train, p.infer)})
    for name in names:
        if name not in plan.profiles:
            plan.profiles[name] = profile_state(m, name)
    devices = {s.device for s in plan.profiles.values() if s.runnable}
    device = torch.device(sorted(devices)[0]) if devices else torch.device("cpu")
    for s in plan.profiles.values():
        if s.runnable and s.device != str(device):
            s.reason = f"runs on {s.device}, this plan's roles run on {device}; drift them in separate runs"
    workload = Workload(m.seed, tuple(m.samples.lengths), m.samples.active_fraction)
    t0 = time.perf_counter()
    setup = ChainSetup(plan.shape, workload, draw_weights(plan.shape, m.seed, device), device)
    say(f"weights drawn on {device} in {time.perf_counter() - t0:.2f} s")
    runs = _Runs(plan, setup, workload, say)
    active = workload.active_mask(workload.logical_rows(), device)
    contract = plan.contract or load_contract(m.contract_path)
    pairs = []
    for pair in plan.pairs:
        say(f"pair {pair.label} ({pair.claim})")
        pairs.append(_compare_pair(plan, runs, pair, active))
    _parity(plan, runs, pairs, contract)
    repeat = _repeatability(plan, runs)
    return {
        "schema": SCHEMA,
        "manifest": {"name": m.name, "path": _manifest_path(m)},
        "seed": m.seed, "device": str(device),
        "shape": plan.shape.model_dump(),
        "samples": {"lengths": list(m.samples.lengths), "tokens": workload.num_tokens,
                    "active_tokens": workload.active_denominator(), "active_fraction": m.samples.active_fraction},
        "boundaries": [{"name": b.name, "op": b.op, "layer": b.layer} for b in setup.boundaries],
        "profiles": {n: {"family": s.family, "device": s.device, "runnable": s.runnable, "reason": s.reason,
                         "missing_ops": s.ops, "deterministic_logp": s.deterministic_logp}
                     for n, s in plan.profiles.items()},
        "pairs": pairs, "repeatability": repeat,
        "options": {"dlogp": plan.dlogp, "rl": plan.rl, "reruns": plan.reruns},
        "seconds": time.perf_counter() - started,
        "provenance": _provenance(),
    }


def _provenance() -> dict:
    """Where the run happened (queried here, so a report signed on another box still says where it ran)."""
    from gradsweep.evidence.provenance import collect_provenance
    from gradsweep.evidence.source_digest import repo_root, tree_digest

    root = repo_root()
    tree = tree_digest(root)
    return {**collect_provenance(root).model_dump(mode="python"),
            "source_tree": {"sha256": tree.sha256, "files": tree.files}}
