"""Readers verify first: report and diff open evidence only through its signature.

Without a trusted signature a reader refuses (exit 1), unless the user explicitly asks for
``--allow-unverified``; then every rendering carries a loud UNVERIFIED banner. Evidence whose cells
came from non-default code carries a warning banner either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gradsweep.evidence.custom_code import custom_code_warnings
from gradsweep.evidence.predicate import Predicate
from gradsweep.evidence.trust import Signer, TrustError, resolve_signers
from gradsweep.evidence.verify import EvidenceError, check_signature, read_evidence


@dataclass(frozen=True)
class OpenedEvidence:
    """A predicate and what a reader must say about it before showing it."""

    predicate: Predicate
    signers: list[Signer]
    banners: list[str] = field(default_factory=list)  # alarming: UNVERIFIED, non-default code

    @property
    def verified(self) -> bool:
        return bool(self.signers)

    def note(self) -> str:
        if not self.signers:
            return "UNVERIFIED"
        return "verified: signed by " + "; ".join(s.describe() for s in self.signers)


def open_evidence(path: Path, trusted_keys: list[Path] | None, trust_file: Path | None,
                  allow_unverified: bool) -> OpenedEvidence:
    """Verify and read; raises EvidenceError (exit 1) unless ``allow_unverified``, which reads and flags."""
    try:
        signers = resolve_signers(trusted_keys, trust_file)
        predicate, who = check_signature(path, signers)
    except (EvidenceError, TrustError) as exc:
        if not allow_unverified:
            raise EvidenceError(f"{exc} (readers verify first: pass --allow-unverified to read it anyway)") from None
        predicate = read_evidence(path)
        banner = f"UNVERIFIED EVIDENCE {path}: {exc}; do not rely on these results"
        return OpenedEvidence(predicate, [], [banner, *custom_code_warnings(predicate)])
    return OpenedEvidence(predicate, who, custom_code_warnings(predicate))
