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
from gradsweep.evidence.freshness import (
    NOT_COMPARED,
    SAME,
    InputCheck,
    extension_check,
    file_check,
    planner_check,
    source_check,
)
from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.evidence.source_digest import file_sha256, repo_root
from gradsweep.evidence.statement import SOURCE_SUBJECT, STATEMENT_TYPE
from gradsweep.evidence.trust import Signer
from gradsweep.evidence.verify import EvidenceError, VerifyReport, allowed_signers, verified_payload


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
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise EvidenceError(f"evidence {path}: cannot read ({exc.strerror})") from None
    payload, signers = verified_payload(data, trusted, path)
    try:
        pred = parse_statement(decode_statement(payload))
    except (EnvelopeError, BenchEvidenceError) as exc:
        raise EvidenceError(f"evidence {path}: signed, but {exc}") from None
    allowed = allowed_signers(signers, pred.manifest.name, path)
    check_chart(path, pred)
    return pred, allowed


def verify_bench(path: Path, trusted: list[Signer], tree: Path | None = None) -> VerifyReport:
    """Signature first (raises EvidenceError), then every input of the figures against the checkout at ``tree``."""
    bench, who = check_bench_signature(path, trusted)
    return VerifyReport(predicate=bench, signers=who, checks=bench_inputs(bench, (tree or repo_root()).resolve(), path),
                        kind="bench")


def check_chart(path: Path, pred: BenchPredicate) -> str:
    """'same' / 'not beside the evidence' / 'none written'; an edited chart raises EvidenceError."""
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
def bench_inputs(pred: BenchPredicate, root: Path, evidence: Path | None = None) -> list[InputCheck]:
    """Every input of the figures against the checkout at ``root`` (the chart's check is reported too)."""
    checks = [source_check(pred.source, root),
              file_check("manifest", pred.manifest.path, pred.manifest.sha256, root, run="bench"),
              file_check("targets", pred.targets.path, pred.targets.sha256, root, run="bench"),
              file_check("contract", pred.contract.path, pred.contract.sha256, root, run="bench"),
              extension_check(pred.extension, root), planner_check(pred.planner, root)]
    if evidence is not None:
        state = check_chart(evidence, pred)
        same = state == "same"
        checks.append(InputCheck("chart", SAME if same else NOT_COMPARED, str(pred.chart.file) if same else state))
    return checks
