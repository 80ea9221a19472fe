"""Readers verify first: report and diff open evidence only through its signature.

Without a trusted signature a reader refuses (exit 1), unless the user explicitly asks for
``--allow-unverified``; then every rendering carries a loud UNVERIFIED banner. Evidence whose cells
came from non-default code carries a warning banner either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from gradsweep.evidence.custom_code import custom_code_warnings
from gradsweep.evidence.predicate import Predicate
from gradsweep.evidence.trust import Signer, TrustError, resolve_signers
from gradsweep.evidence.verify import EvidenceError, VerifyReport, check_signature, read_evidence, verify_evidence

P = TypeVar("P")


@dataclass(frozen=True)
class Opened(Generic[P]):
    """A predicate (sweep or bench) and what a reader must say about it before showing it."""

    predicate: P
    signers: list[Signer]
    banners: list[str] = field(default_factory=list)  # alarming: UNVERIFIED, non-default code

    @property
    def verified(self) -> bool:
        return bool(self.signers)

    def note(self) -> str:
        if not self.signers:
            return "UNVERIFIED"
        return "verified: signed by " + "; ".join(s.describe() for s in self.signers)


OpenedEvidence = Opened[Predicate]


def open_signed(path: Path, trusted_keys: list[Path] | None, trust_file: Path | None, allow_unverified: bool,
                check: Callable[[Path, list[Signer]], tuple[P, list[Signer]]], read: Callable[[Path], P],
                warnings: Callable[[P], list[str]] = lambda _p: []) -> Opened[P]:
    """Verify with ``check`` and read; raises EvidenceError (exit 1) unless ``allow_unverified``, which reads with
    ``read`` (structure only) and flags it. ``warnings`` are the predicate's own banners (non-default code)."""
    try:
        signers = resolve_signers(trusted_keys, trust_file)
        predicate, who = check(path, signers)
    except (EvidenceError, TrustError) as exc:
        if not allow_unverified:
            raise EvidenceError(f"{exc} (readers verify first: pass --allow-unverified to read it anyway)") from None
        predicate = read(path)
        banner = f"UNVERIFIED EVIDENCE {path}: {exc}; do not rely on these results"
        return Opened(predicate, [], [banner, *warnings(predicate)])
    return Opened(predicate, who, warnings(predicate))


def open_evidence(path: Path, trusted_keys: list[Path] | None, trust_file: Path | None,
                  allow_unverified: bool) -> Opened[Predicate]:
    """Sweep evidence, verified first (see ``open_signed``)."""
    return open_signed(path, trusted_keys, trust_file, allow_unverified, check_signature, read_evidence,
                       custom_code_warnings)


def verify_any_evidence(path: Path, trusted: list[Signer], tree: Path | None = None) -> VerifyReport:
    """``gradsweep verify``'s reader: bench evidence through the bench verifier, sweep evidence through the sweep's
    (chosen by the statement's predicate type, read before anything is trusted; both verify the signature first)."""
    from gradsweep.bench.evidence import is_bench_evidence, verify_bench

    if is_bench_evidence(path):
        return verify_bench(path, trusted, tree)
    return verify_evidence(path, trusted, tree)
