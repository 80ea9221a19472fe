"""Bench evidence: the sweep's envelope, signing and trust, around the bench predicate.

An in-toto Statement v1 (subjects: the manifest file and the source tree, as in sweep evidence) with predicate
type ``https://gradsweep.dev/bench/v1``, canonical JSON in a DSSE envelope signed with Ed25519, written
atomically. Reading goes through the same strict envelope parser and the same trusted signers (trust file or
--trusted-key) as sweep evidence; ``verify`` then compares every input of the figures with this checkout:
source tree, manifest, targets file, contract and built extension (stale: exit 4), and checks the chart
beside the evidence against its recorded digest (an edited chart is refused like an edited file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gradsweep.bench.predicate import BENCH_PREDICATE, BenchPredicate
from gradsweep.evidence.envelope import EnvelopeError, decode_statement, open_envelope, seal, write_atomic
from gradsweep.evidence.extension import extension_digest
from gradsweep.evidence.freshness import DIFFERS, EXTENSION, MISSING, NOT_COMPARED, NOT_RECORDED, SAME, InputCheck
from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.evidence.paths import is_external, resolve_recorded
from gradsweep.evidence.source_digest import file_sha256, tree_digest
from gradsweep.evidence.statement import SOURCE_SUBJECT, STATEMENT_TYPE
from gradsweep.evidence.trust import Signer


class BenchEvidenceError(ValueError):
    """Bench evidence that is unreadable, malformed, badly signed, untrusted, or whose chart was edited."""


def subjects(pred: BenchPredicate) -> list[dict[str, Any]]:
    return [{"name": f"manifest:{pred.manifest.name}", "digest": {"sha256": pred.manifest.sha256}},
            {"name": SOURCE_SUBJECT, "digest": {"sha256": pred.source.sha256}}]


def build_statement(pred: BenchPredicate) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": subjects(pred), "predicateType": BENCH_PREDICATE,
            "predicate": jsonable(pred.model_dump(mode="python"))}


def parse_statement(statement: Any) -> BenchPredicate:
    """The typed predicate of a bench statement (type, schema and subjects checked)."""
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise BenchEvidenceError(f"payload _type is not {STATEMENT_TYPE}")
    if statement.get("predicateType") != BENCH_PREDICATE:
        raise BenchEvidenceError(f"predicateType is {statement.get('predicateType')!r}, expected {BENCH_PREDICATE}")
    try:
        pred = BenchPredicate.model_validate(statement.get("predicate"))
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise BenchEvidenceError(f"predicate does not match the bench schema at {where}: {err['msg']}") from None
    if statement.get("subject") != subjects(pred):
        raise BenchEvidenceError("subjects do not match the predicate's manifest and source digests")
    return pred


def write_bench_evidence(out: Path, pred: BenchPredicate, signer: Any) -> Path:
    write_atomic(out, seal(build_statement(pred), signer))
    return out


def predicate_type(path: Path) -> str | None:
    """The statement type of an evidence file, read WITHOUT verifying (to choose its reader); None if unreadable."""
    try:
        statement = decode_statement(open_envelope(path.read_bytes()).payload)
    except (OSError, EnvelopeError):
        return None
    value = statement.get("predicateType")
    return value if isinstance(value, str) else None


def is_bench_evidence(path: Path) -> bool:
    return path.is_file() and predicate_type(path) == BENCH_PREDICATE


def read_bench(path: Path) -> BenchPredicate:
    """Structure only, signature NOT verified (the explicit --allow-unverified path)."""
    try:
        return parse_statement(decode_statement(open_envelope(path.read_bytes()).payload))
    except OSError as exc:
        raise BenchEvidenceError(f"evidence {path}: cannot read ({exc.strerror})") from None
    except (EnvelopeError, BenchEvidenceError) as exc:
        raise BenchEvidenceError(f"evidence {path}: {exc}") from None


def check_bench_signature(path: Path, trusted: list[Signer]) -> tuple[BenchPredicate, list[Signer]]:
    """Verify the signature against trusted signers and the signer's permission for the manifest."""
    from gradsweep.evidence.verify import EvidenceError, verified_payload

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EvidenceError(f"evidence {path}: cannot read ({exc.strerror})") from None
    payload, signers = verified_payload(data, trusted, path)
    try:
        pred = parse_statement(decode_statement(payload))
    except (EnvelopeError, BenchEvidenceError) as exc:
        raise EvidenceError(f"evidence {path}: signed, but {exc}") from None
    allowed = [s for s in signers if s.may_sign(pred.manifest.name)]
    if not allowed:
        names = ", ".join(f"{s.name} (may sign: {', '.join(s.manifests or ())})" for s in signers)
        raise EvidenceError(f"evidence {path}: signed by {names}, which the trust file does not allow to sign "
                            f"manifest {pred.manifest.name!r}")
    check_chart(path, pred)
    return pred, allowed


def check_chart(path: Path, pred: BenchPredicate) -> str:
    """'same' / 'not beside the evidence' / 'none written'; an edited chart raises EvidenceError."""
    from gradsweep.evidence.verify import EvidenceError

    if pred.chart.file is None or pred.chart.sha256 is None:
        return "none written"
    chart = path.parent / pred.chart.file
    if not chart.is_file():
        return "not beside the evidence (not compared)"
    if file_sha256(chart) != pred.chart.sha256:
        raise EvidenceError(f"evidence {path}: chart {chart.name} was changed after signing (sha256 "
                            f"{file_sha256(chart)[:16]}, signed {pred.chart.sha256[:16]})")
    return "same"


# ------------------------------------------------------------------------------------------------ freshness
def _file(name: str, recorded: str | None, sha: str | None, root: Path) -> InputCheck:
    if recorded is None and sha is None:
        return InputCheck(name, NOT_COMPARED, "the run used none")
    if sha is None:
        return InputCheck(name, NOT_RECORDED, f"no digest of {recorded}")
    if recorded is None or is_external(recorded):
        return InputCheck(name, NOT_COMPARED, f"{recorded or 'file'} was outside the repository when the bench ran")
    current = resolve_recorded(recorded, root)
    if current is None or not current.is_file():
        return InputCheck(name, MISSING, f"{recorded} is not in this checkout")
    digest = file_sha256(current)
    if digest != sha:
        return InputCheck(name, DIFFERS, f"{recorded} is {digest[:16]}, the bench used {sha[:16]}")
    return InputCheck(name, SAME, recorded)


def bench_inputs(pred: BenchPredicate, root: Path, evidence: Path | None = None) -> list[InputCheck]:
    """Every input of the figures against the checkout at ``root`` (the chart's check is reported too)."""
    tree = tree_digest(root, tuple(pred.source.roots)).sha256
    roots = "+".join(pred.source.roots)
    checks = [InputCheck("source tree", SAME, f"{roots} {tree[:16]}") if tree == pred.source.sha256 else
              InputCheck("source tree", DIFFERS, f"{roots} is {tree[:16]}, the bench ran {pred.source.sha256[:16]}"),
              _file("manifest", pred.manifest.path, pred.manifest.sha256, root),
              _file("targets", pred.targets.path, pred.targets.sha256, root),
              _file("contract", pred.contract.path, pred.contract.sha256, root)]
    here = extension_digest(root)
    rec = pred.extension
    if here is None:
        checks.append(InputCheck(EXTENSION, NOT_COMPARED, "not built in this checkout" if rec else
                                 "not built for the run, not built here"))
    elif rec is None:
        checks.append(InputCheck(EXTENSION, DIFFERS, f"this checkout has {here[1][:16]}; the run had no built "
                                 "extension"))
    elif here[1] != rec.sha256:
        checks.append(InputCheck(EXTENSION, DIFFERS, f"{here[1][:16]} here, the bench measured {rec.sha256[:16]}"))
    else:
        checks.append(InputCheck(EXTENSION, SAME, f"{rec.path} {rec.sha256[:16]}"))
    if evidence is not None:
        state = check_chart(evidence, pred)
        same = state == "same"
        checks.append(InputCheck("chart", SAME if same else NOT_COMPARED, str(pred.chart.file) if same else state))
    return checks
