"""Reading and verifying evidence files: signature against trusted keys, then freshness of the tree."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from securesystemslib.exceptions import VerificationError

from gradsweep.evidence.envelope import EnvelopeError, decode_statement, open_envelope
from gradsweep.evidence.predicate import Predicate
from gradsweep.evidence.signing import TrustedKey
from gradsweep.evidence.source_digest import tree_digest
from gradsweep.evidence.statement import StatementError, parse_statement


class EvidenceError(ValueError):
    """Evidence that is unreadable, malformed, badly signed or signed by an untrusted key."""


@dataclass(frozen=True)
class VerifyReport:
    predicate: Predicate
    signed_by: list[str]
    current_source: str
    stale: bool


def read_evidence(path: Path) -> Predicate:
    """The predicate of an evidence file, structure checked but signature NOT verified (reports, diff)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EvidenceError(f"evidence {path}: cannot read ({exc.strerror})") from None
    try:
        return parse_statement(decode_statement(open_envelope(data).payload))
    except (EnvelopeError, StatementError) as exc:
        raise EvidenceError(f"evidence {path}: {exc}") from None


def check_signature(path: Path, trusted: list[TrustedKey]) -> tuple[Predicate, list[str]]:
    """Verify the DSSE signature with the trusted keys; return the predicate and who signed."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EvidenceError(f"evidence {path}: cannot read ({exc.strerror})") from None
    return check_signature_bytes(data, trusted, path)


def check_signature_bytes(data: bytes, trusted: list[TrustedKey], path: Path | str = "<bytes>",
                          ) -> tuple[Predicate, list[str]]:
    """``check_signature`` on the file's bytes."""
    if not trusted:
        raise EvidenceError("no trusted public keys: pass --trusted-key PUB.pem")
    try:
        envelope = open_envelope(data)
    except EnvelopeError as exc:
        raise EvidenceError(f"evidence {path}: {exc}") from None
    by_id = {t.key.keyid: t for t in trusted}
    known = [k for k in envelope.signatures if k in by_id]
    if not known:
        ids = ", ".join(k[:16] for k in envelope.signatures)
        raise EvidenceError(f"evidence {path}: signed by an untrusted key (keyid {ids}); "
                            "pass its public key with --trusted-key if you trust it")
    try:
        accepted = envelope.verify([by_id[k].key for k in known], 1)
    except VerificationError:
        raise EvidenceError(f"evidence {path}: BAD SIGNATURE (the file was altered or the signature "
                            "is not from the key it names)") from None
    try:
        predicate = parse_statement(decode_statement(envelope.payload))
    except (EnvelopeError, StatementError) as exc:
        raise EvidenceError(f"evidence {path}: signed, but {exc}") from None
    return predicate, [by_id[k].source for k in accepted]


def verify_evidence(path: Path, trusted: list[TrustedKey], tree: Path | None = None) -> VerifyReport:
    """Signature first (raises EvidenceError), then staleness against the source tree at ``tree``."""
    predicate, signers = check_signature(path, trusted)
    current = tree_digest(tree, tuple(predicate.source.roots)).sha256
    return VerifyReport(predicate=predicate, signed_by=signers, current_source=current,
                        stale=current != predicate.source.sha256)
