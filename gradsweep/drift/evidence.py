"""Drift evidence, signed like sweep evidence: an in-toto Statement v1 in a DSSE envelope (Ed25519, RFC 8785).

Subjects: the manifest file, the source tree (csrc/ and gradsweep/), and every artifact the run wrote beside
the envelope (the JSON report and the PNG plot), by sha256, so neither can be swapped without the signature
noticing. Predicate (``https://gradsweep.dev/drift/v1``): the whole report and the run's provenance. Built from
the public functions of gradsweep.evidence (seal, write_atomic, open_envelope, decode_statement, digests,
provenance, signers); ``verify_drift`` is its reader.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from securesystemslib.exceptions import VerificationError

from gradsweep.evidence.envelope import EnvelopeError, decode_statement, open_envelope, seal, write_atomic
from gradsweep.evidence.freshness import NOT_COMPARED, InputCheck, file_check, source_check
from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.evidence.paths import is_external, resolve_recorded
from gradsweep.evidence.predicate import SourceRef
from gradsweep.evidence.provenance import collect_provenance
from gradsweep.evidence.signing import resolve_signer
from gradsweep.evidence.source_digest import file_sha256, repo_root, tree_digest
from gradsweep.evidence.statement import SOURCE_SUBJECT, STATEMENT_TYPE
from gradsweep.evidence.trust import Signer

DRIFT_PREDICATE = "https://gradsweep.dev/drift/v1"
EVIDENCE_NAME = "drift.evidence.json"


class DriftEvidenceError(ValueError):
    """Drift evidence that is unreadable, badly signed, untrusted, or does not match its artifacts."""


def _subjects(manifest: Path | None, artifacts: list[Path], source_sha: str) -> list[dict]:
    subjects = []
    if manifest is not None:
        subjects.append({"name": f"manifest:{manifest.name}", "digest": {"sha256": file_sha256(manifest)}})
    subjects.append({"name": SOURCE_SUBJECT, "digest": {"sha256": source_sha}})
    subjects += [{"name": f"artifact:{a.name}", "digest": {"sha256": file_sha256(a)}} for a in artifacts]
    return subjects


def sign_drift(report: dict, out_dir: Path, artifacts: list[Path], key: Path | None,
               say: Callable[[str], None] = lambda s: None) -> Path:
    """Write ``out_dir/drift.evidence.json`` over the report and the artifact files (already written).

    The provenance is the report's own (the box that ran the drift); the source digest is the signing box's
    tree, which must be the tree that ran (the report's ``provenance.source_tree`` says which that was).
    """
    root = repo_root()
    tree = tree_digest(root)
    recorded = report["manifest"].get("path")
    manifest = resolve_recorded(recorded, root) or (Path(recorded) if recorded and Path(recorded).is_absolute()
                                                    else None)
    signer, key_path = resolve_signer(key, say)
    ran = report.get("provenance")
    ran_tree = (ran or {}).get("source_tree", {}).get("sha256")
    if ran_tree is not None and ran_tree != tree.sha256:
        raise DriftEvidenceError(f"the report ran on source tree {ran_tree[:16]}..., this checkout hashes to "
                                 f"{tree.sha256[:16]}...; sign it from the tree that ran")
    predicate = {"report": report,
                 "provenance": ran if ran is not None else collect_provenance(root).model_dump(mode="python"),
                 "source": {"sha256": tree.sha256, "files": tree.files, "roots": list(tree.roots)},
                 "artifacts": {a.name: file_sha256(a) for a in artifacts}}
    statement = {"_type": STATEMENT_TYPE, "subject": _subjects(manifest, artifacts, tree.sha256),
                 "predicateType": DRIFT_PREDICATE, "predicate": jsonable(predicate)}
    path = out_dir / EVIDENCE_NAME
    write_atomic(path, seal(statement, signer))
    say(f"signed {path} with {key_path}")
    return path


def is_drift_evidence(path: Path) -> bool:
    """Whether ``path`` holds a drift statement, read WITHOUT verifying (to choose its reader)."""
    try:
        statement = decode_statement(open_envelope(path.read_bytes()).payload)
    except (OSError, EnvelopeError):
        return False
    return statement.get("predicateType") == DRIFT_PREDICATE


def drift_input_checks(predicate: dict, root: Path) -> list[InputCheck]:
    """The run's inputs against the checkout at ``root``: the source tree and the manifest (by the digest the
    statement's subject holds). The extension is compared by its sources (csrc/ is in the tree)."""
    source = predicate.get("source") or {}
    checks = [source_check(SourceRef(sha256=source.get("sha256", ""), files=source.get("files", 0),
                                     roots=source.get("roots", ["csrc", "gradsweep"])), root)]
    recorded = predicate["report"].get("manifest", {}).get("path")
    if recorded is None or is_external(recorded):
        checks.append(InputCheck("manifest", NOT_COMPARED, f"{recorded or 'the manifest'} was outside the repository "
                                                           "when the drift ran"))
    else:
        checks.append(file_check("manifest", recorded, predicate.get("_manifest_sha256"), root, run="drift"))
    return checks


def verify_drift(path: Path, trusted: list[Signer], check_artifacts: bool = True) -> dict:
    """Check the signature against trusted signers, the statement's type and the artifacts beside it; return
    the predicate (with ``_manifest_sha256``, the manifest subject's digest, for the freshness checks). Raises
    DriftEvidenceError naming what is wrong."""
    try:
        envelope = open_envelope(path.read_bytes())
    except (OSError, EnvelopeError) as exc:
        raise DriftEvidenceError(f"drift evidence {path}: {exc}") from None
    by_id = {s.keyid: s for s in trusted}
    known = [k for k in envelope.signatures if k in by_id]
    if not known:
        raise DriftEvidenceError(f"drift evidence {path}: signed by an untrusted key")
    try:
        envelope.verify([by_id[k].trusted.key for k in known], 1)
    except VerificationError:
        raise DriftEvidenceError(f"drift evidence {path}: BAD SIGNATURE (the file was altered)") from None
    try:
        statement = decode_statement(envelope.payload)
    except EnvelopeError as exc:
        raise DriftEvidenceError(f"drift evidence {path}: {exc}") from None
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != DRIFT_PREDICATE:
        raise DriftEvidenceError(f"drift evidence {path}: not a drift statement ({statement.get('predicateType')})")
    predicate = statement["predicate"]
    manifests = [s["digest"]["sha256"] for s in statement.get("subject", [])
                 if s.get("name", "").startswith("manifest:")]
    predicate["_manifest_sha256"] = manifests[0] if manifests else None
    if check_artifacts:
        for name, digest in predicate.get("artifacts", {}).items():
            art = path.parent / name
            if not art.is_file() or file_sha256(art) != digest:
                raise DriftEvidenceError(f"drift evidence {path}: artifact {name} is missing or was changed "
                                         "after signing")
    return predicate
