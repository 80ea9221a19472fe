"""Reading and verifying evidence: the signature against trusted signers, then every verdict input.

Readers (report, diff, merge) call ``check_signature`` before they trust a byte; ``read_evidence``
(structure only, no signature) is for the explicit ``--allow-unverified`` path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from securesystemslib.exceptions import VerificationError

from gradsweep.evidence.envelope import EnvelopeError, decode_statement, open_envelope
from gradsweep.evidence.freshness import InputCheck, check_inputs
from gradsweep.evidence.predicate import Predicate
from gradsweep.evidence.result_statement import ResultStatementError, check_result_statement, result_statement_path
from gradsweep.evidence.source_digest import repo_root
from gradsweep.evidence.statement import StatementError, parse_statement
from gradsweep.evidence.trust import Signer


class EvidenceError(ValueError):
    """Evidence that is unreadable, malformed, badly signed or signed by an untrusted key."""


@dataclass(frozen=True)
class VerifyReport:
    predicate: Predicate | Any  # a closeout Predicate, or another kind's predicate (``kind`` says which)
    signers: list[Signer]
    checks: list[InputCheck] = field(default_factory=list)
    result_statement: str | None = None  # "PASSED"/"WARNED"/"FAILED" when a test-result file was checked
    kind: str = "closeout"  # "closeout" (sweep, merge), or another kind's verifier's name ("bench")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except IsADirectoryError:
        raise EvidenceError(f"evidence {path}: is a directory; give an evidence file") from None
    except OSError as exc:
        raise EvidenceError(f"evidence {path}: cannot read ({exc.strerror})") from None


def read_evidence(path: Path) -> Predicate:
    """The predicate of an evidence file, structure checked but signature NOT verified."""
    data = _read(path)
    try:
        return parse_statement(decode_statement(open_envelope(data).payload))
    except (EnvelopeError, StatementError) as exc:
        raise EvidenceError(f"evidence {path}: {exc}") from None


def check_signature(path: Path, trusted: list[Signer]) -> tuple[Predicate, list[Signer]]:
    """Verify the DSSE signature and the signer's permission; return the predicate and who signed."""
    return check_signature_bytes(_read(path), trusted, path)


def _verified_payload(data: bytes, trusted: list[Signer], path: Path | str) -> tuple[bytes, list[Signer]]:
    try:
        envelope = open_envelope(data)
    except EnvelopeError as exc:
        raise EvidenceError(f"evidence {path}: {exc}") from None
    by_id = {s.keyid: s for s in trusted}
    known = [k for k in envelope.signatures if k in by_id]
    if not known:
        ids = ", ".join(k[:16] for k in envelope.signatures)
        where = "it is not among the --trusted-key keys" if trusted and trusted[0].manifests is None else \
            "no entry of the trust file has it (see docs/evidence.md); pass its public key with --trusted-key " \
            "for an ad-hoc check"
        raise EvidenceError(f"evidence {path}: signed by an untrusted key (keyid {ids}); {where}")
    try:
        accepted = envelope.verify([by_id[k].trusted.key for k in known], 1)
    except VerificationError:
        raise EvidenceError(f"evidence {path}: BAD SIGNATURE (the file was altered or the signature "
                            "is not from the key it names)") from None
    return envelope.payload, [by_id[k] for k in accepted]


def verified_payload(data: bytes, trusted: list[Signer], path: Path | str) -> tuple[bytes, list[Signer]]:
    """The payload of envelope bytes whose signature verifies against a trusted key, and who signed it (readers
    of other statement types, e.g. bench evidence, share the same trust rules)."""
    return _verified_payload(data, trusted, path)


def check_signature_bytes(data: bytes, trusted: list[Signer], path: Path | str = "<bytes>",
                          ) -> tuple[Predicate, list[Signer]]:
    """``check_signature`` on the file's bytes."""
    payload, signers = _verified_payload(data, trusted, path)
    try:
        predicate = parse_statement(decode_statement(payload))
    except (EnvelopeError, StatementError) as exc:
        raise EvidenceError(f"evidence {path}: signed, but {exc}") from None
    return predicate, allowed_signers(signers, predicate.manifest.name, path)


def allowed_signers(signers: list[Signer], manifest: str, path: Path | str) -> list[Signer]:
    """The verified signers the trust file allows to sign ``manifest``'s evidence; EvidenceError when none is."""
    allowed = [s for s in signers if s.may_sign(manifest)]
    if not allowed:
        names = ", ".join(f"{s.name} (may sign: {', '.join(s.manifests or ())})" for s in signers)
        raise EvidenceError(f"evidence {path}: signed by {names}, which the trust file does not allow to sign "
                            f"manifest {manifest!r}")
    return allowed


def check_result_file(evidence: Path, pred: Predicate, trusted: list[Signer]) -> str | None:
    """Verify the Test Result statement beside ``evidence`` if there is one; its result, else None."""
    path = result_statement_path(evidence)
    if not path.is_file():
        return None
    payload, signers = _verified_payload(_read(path), trusted, path)
    if not any(s.may_sign(pred.manifest.name) for s in signers):
        raise EvidenceError(f"test result {path}: its signer may not sign manifest {pred.manifest.name!r}")
    try:
        return check_result_statement(decode_statement(payload), pred)
    except (EnvelopeError, ResultStatementError) as exc:
        raise EvidenceError(f"test result {path}: {exc}") from None


def verify_evidence(path: Path, trusted: list[Signer], tree: Path | None = None) -> VerifyReport:
    """Closeout evidence: signature first (raises EvidenceError), then every verdict input against the checkout
    at ``tree``. Bench evidence has its own verifier (``gradsweep.bench.evidence.verify_bench``)."""
    predicate, signers = check_signature(path, trusted)
    result = check_result_file(path, predicate, trusted)
    checks = check_inputs(predicate, (tree or repo_root()).resolve())
    return VerifyReport(predicate=predicate, signers=signers, checks=checks, result_statement=result)
