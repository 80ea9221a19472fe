"""What a drift run compares: pairs of roles (profile x layout), and whether each profile can run the chain.

A pair is a train-style role (e.g. one packed call) and an inference-style role (decode, or chunked prefill
through the KV cache). Its claim depends on the profiles, and the two are never mixed in a report:

- same profile: a **bitwise** claim (batch invariance of one backend: are the bits the same?);
- different profiles: **tolerance-based cross-backend parity** (bits are not expected to match; the measured
  differences are reported, and each side's logp is judged against the FP64 reference by the contract).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradsweep.drift.runner import missing_kernels
from gradsweep.manifest import Manifest

BITWISE, PARITY = "bitwise", "parity"
# The chain's op names as the manifest names them (its candidates' declarations carry the reasons).
MANIFEST_OP = {"linear": "det_gemm"}


@dataclass(frozen=True)
class Role:
    profile: str
    layout: str

    @property
    def label(self) -> str:
        return f"{self.profile}:{self.layout}"


@dataclass(frozen=True)
class Pair:
    train: Role
    infer: Role

    @property
    def claim(self) -> str:
        return BITWISE if self.train.profile == self.infer.profile else PARITY

    @property
    def label(self) -> str:
        return f"{self.train.label} vs {self.infer.label}"


@dataclass
class ProfileState:
    """Whether a profile can run the chain on this box, and why not (per op where an op is missing)."""

    name: str
    family: str
    device: str | None
    reason: str = ""
    ops: dict[str, str] = field(default_factory=dict)
    deterministic_logp: bool = False

    @property
    def runnable(self) -> bool:
        return not self.reason


def profile_state(manifest: Manifest, name: str) -> ProfileState:
    """Requirements, device and chain kernels of one profile (a missing one is a reason, never a fallback).

    The profile advertises same-backend, same-build deterministic logp only where its manifest entry says so.
    """
    from gradsweep.harness.hardware import check_requirements, resolve_device

    prof = manifest.profiles[name]
    advertised = prof.deterministic_logp
    blocked = check_requirements(list(prof.requires))
    if blocked is not None:
        return ProfileState(name, prof.family, None, f"cannot run on this box: {blocked[1]}",
                            deterministic_logp=advertised)
    device = str(resolve_device(prof.device))
    missing = missing_kernels(prof.family)
    for op in list(missing):
        decl = prof.candidates.get(MANIFEST_OP.get(op, op))
        if decl is not None and decl.impl is None and decl.reason:
            missing[op] = f"{decl.status.value}: {decl.reason}"
    reason = ""
    if missing:
        reason = (f"the {prof.family} family has no kernel for {', '.join(sorted(missing))}; the chain cannot run "
                  "on this profile (a profile never borrows another family's kernel)")
    return ProfileState(name, prof.family, device, reason, missing, advertised)


def default_pairs(profiles: list[str], train: str, infer: str) -> list[Pair]:
    """Each profile against itself: ``train`` layout vs ``infer`` layout (bitwise claims)."""
    return [Pair(Role(p, train), Role(p, infer)) for p in profiles]
