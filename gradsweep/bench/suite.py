"""Which cases run, for which families, on which candidates: the manifest's ops and profiles, the filters, and
what this box can run.

A family is benched through one profile of the manifest: a non-torch profile whose device is this run's and
whose requirements hold here (a profile that cannot run is recorded as blocked, with why). Its candidate for an
op is the profile's declaration; an op the manifest does not sweep (the step-level cases) uses the family's
registered ``<family>.<op>`` candidate. The stock path is every case's baseline, whatever the profiles say.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from gradsweep.bench.cases import Case
from gradsweep.bench.catalog import HOST_IMPLS, STEP_OPS, catalog, default_cases
from gradsweep.errors import BadInput
from gradsweep.families import impl_id
from gradsweep.manifest import CandidateStatus, Manifest
from gradsweep.ops.base import Candidate


@dataclass(frozen=True)
class Slot:
    """One family of one case: the candidate to time, or why it cannot run. A host-only case (the fold plan) has
    no candidate: its subject times the family's own host work, on a profile that can run here (``host_impl``
    names it)."""

    family: str
    profile: str
    candidate: Candidate | None
    reason: str = ""
    host_impl: str = ""

    @property
    def runnable(self) -> bool:
        return self.candidate is not None or bool(self.host_impl)


@dataclass
class Selection:
    device: str
    cases: list[Case]
    profiles: dict[str, str]                       # family -> profile
    blocked: dict[str, str] = field(default_factory=dict)  # profile -> reason
    slots: dict[str, list[Slot]] = field(default_factory=dict)  # case id -> its families
    env: dict[str, str] = field(default_factory=dict)


def _profiles(manifest: Manifest, device: str, families: list[str] | None = None,
              ) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """(family -> profile, profile -> blocked reason, env to apply) for the profiles this device can run, of the
    wanted families only (an unwanted family's env is not applied)."""
    chosen: dict[str, str] = {}
    blocked: dict[str, str] = {}
    env: dict[str, str] = {}
    for name, prof in manifest.profiles.items():
        if prof.family == "torch" or (families and prof.family not in families):
            continue
        if prof.device not in (device, "auto"):
            blocked[name] = f"runs on {prof.device}, this run is on {device}"
            continue
        if prof.family in chosen:
            blocked[name] = f"family {prof.family} is already benched through profile {chosen[prof.family]}"
            continue
        for key, value in prof.env.items():
            if env.get(key, value) != value:
                raise BadInput(f"manifest: profiles {name} and another both set {key} differently; bench runs in "
                               "one process: keep one of them (--family)")
            env[key] = value
        chosen[prof.family] = name
    return chosen, blocked, env


def check_requirements_here(manifest: Manifest, chosen: dict[str, str], blocked: dict[str, str]) -> None:
    """Move every chosen profile whose requirements fail here (after its env is applied) to ``blocked``."""
    from gradsweep.harness.hardware import check_requirements

    for family, name in list(chosen.items()):
        failed = check_requirements(list(manifest.profiles[name].requires))
        if failed is not None:
            blocked[name] = failed[1]
            del chosen[family]


def _candidate(manifest: Manifest, profile: str, op: str, family: str) -> tuple[Candidate | None, str]:
    from gradsweep.ops.registry import get_op

    spec = get_op(op)
    if op not in manifest.ops:
        impl = impl_id(family, op)
        if impl in spec.candidates:
            return spec.candidates[impl], ""
        return None, f"no {impl} candidate is registered"
    decl = manifest.profiles[profile].candidates.get(op)
    if decl is None:
        return None, f"profile {profile} declares no candidate for {op}"
    if decl.status not in (CandidateStatus.REQUIRED, CandidateStatus.OPTIONAL) or decl.impl is None:
        return None, f"{decl.status.value}: {decl.reason}" + (f" ({decl.tracking})" if decl.tracking else "")
    return spec.candidates[decl.impl], ""


def select(manifest: Manifest, ops: list[str] | None, families: list[str] | None, quick: bool,
           device: str) -> Selection:
    """The run's cases and each case's families; unknown filter names are BadInput (exit 2)."""
    from gradsweep.ops.registry import get_op

    chosen, blocked, env = _profiles(manifest, device, families)
    apply_env(env)
    check_requirements_here(manifest, chosen, blocked)
    declared = catalog(quick)
    known_ops = list(dict.fromkeys([*manifest.ops, *STEP_OPS]))
    for name in ops or []:
        if name not in known_ops:
            raise BadInput(f"--op {name}: not an op of manifest {manifest.name} nor a step case; known: "
                           f"{', '.join(known_ops)}")
    all_families = sorted({p.family for p in manifest.profiles.values() if p.family != "torch"})
    for name in families or []:
        if name not in all_families:
            raise BadInput(f"--family {name}: not a family of manifest {manifest.name}; known: "
                           f"{', '.join(all_families)}")
    wanted = [op for op in known_ops if not ops or op in ops]
    cases: list[Case] = []
    for op in wanted:
        mine = [c for c in declared if c.op == op]
        if not mine and op in manifest.ops:
            spec = get_op(op)
            mine = default_cases(op, manifest.shape(op), manifest.samples.lengths, quick, spec.differentiable)
        cases += mine
    sel = Selection(device=device, cases=[], profiles=chosen, blocked=blocked, env=env)
    for case in cases:
        slots = []
        for fam in case.families:
            if families and fam not in families:
                continue
            profile = chosen.get(fam)
            if profile is None:
                why = next(((p, r) for p, r in blocked.items() if manifest.profiles[p].family == fam), None)
                if why is not None:  # a profile of the family exists but cannot run here
                    slots.append(Slot(fam, why[0], None, f"blocked: {why[1]}"))
                continue
            if case.host_only:
                slots.append(Slot(fam, profile, None, host_impl=HOST_IMPLS[case.runner](fam)))
                continue
            cand, why = _candidate(manifest, profile, case.op, fam)
            slots.append(Slot(fam, profile, cand, why))
        if slots:
            case = normalised(case)
            sel.cases.append(case)
            sel.slots[case.id] = slots
    return sel


def normalised(case: Case) -> Case:
    """The case with its shapes as the op's shape model fills them (defaults such as eps, theta)."""
    from gradsweep.ops.registry import get_op

    if case.runner == "fold_plan":
        return case
    model = get_op(case.op).shape_model

    def fill(shape: dict | None) -> dict | None:
        return None if shape is None else model.model_validate(shape).model_dump(exclude_none=True)

    return replace(case, shape=fill(case.shape), check_shape=fill(case.check_shape))


class EnvTooLate(BadInput):
    """The chosen profiles set a Triton switch that Triton has already read in this process.

    Triton reads its switches (TRITON_INTERPRET above all) when a function is decorated, and its own library
    functions are decorated when it is imported, which torch does on its own import: setting the switch later
    leaves Triton half interpreted ("Cannot call @triton.jit'd outside of the scope of a kernel"). The bench is
    one process, so it needs the switch from its start; the CLI re-runs itself once with ``env`` set.
    """

    def __init__(self, env: dict[str, str], late: dict[str, str]) -> None:
        self.env = env
        sets = " ".join(f"{k}={v}" for k, v in late.items())
        super().__init__(f"the bench's profiles need {sets} from the start of the process (Triton reads it when it "
                         f"is imported, and it was imported already): run `{sets} gradsweep bench ...`, or pick "
                         "the families that need no switch with --family")


def apply_env(env: dict[str, str]) -> None:
    """Set the chosen profiles' environment before any kernel module is imported (the bench is one process).

    A Triton switch that differs from what Triton read at its import is refused (``EnvTooLate``) before
    anything is set, never applied half way.
    """
    import sys

    late = {k: v for k, v in env.items()
            if k.startswith("TRITON_") and "triton" in sys.modules and os.environ.get(k) != v}
    if late:
        raise EnvTooLate(env, late)
    for key, value in env.items():
        os.environ[key] = value
