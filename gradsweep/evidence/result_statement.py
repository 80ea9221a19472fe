"""The in-toto Test Result v0.1 statement: the sweep's verdict in a form stock in-toto tooling reads.

It is a second DSSE envelope written beside the evidence (``<name>.test-result.json``), signed by the
same key, over the same subjects as the closeout statement. Mapping of cells:

- ``passedTests``: green cells; ``warnedTests``: tracked reds; ``failedTests``: untracked reds and
  errors, and under ``--strict`` blocked cells too. Blocked and skipped cells did not run and are in
  no list (the closeout predicate has them).
- ``result``: FAILED when the sweep's exit code is not 0 (this includes "nothing could run"),
  WARNED when it passed with tracked reds or stale tracked entries, else PASSED.
- ``configuration``: the manifest, contract and tracked-reds files by repository-relative path and
  sha256 (each only when the run used one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gradsweep.evidence.predicate import Predicate
from gradsweep.evidence.statement import STATEMENT_TYPE, statement_subjects

TEST_RESULT_TYPE = "https://in-toto.io/attestation/test-result/v0.1"
_EVIDENCE_SUFFIX = ".evidence.json"
_TEST_RESULT_SUFFIX = ".test-result.json"


class ResultStatementError(ValueError):
    """A test-result statement that does not match its evidence."""


def result_statement_path(evidence: Path) -> Path:
    """out/x.evidence.json -> out/x.test-result.json; any other name gets .test-result.json appended."""
    name = evidence.name
    if name.endswith(_EVIDENCE_SUFFIX):
        return evidence.with_name(name[: -len(_EVIDENCE_SUFFIX)] + _TEST_RESULT_SUFFIX)
    return evidence.with_name(name + _TEST_RESULT_SUFFIX)


def _configuration(pred: Predicate) -> list[dict[str, Any]]:
    config = [{"name": pred.manifest.path, "digest": {"sha256": pred.manifest.sha256}}]
    if pred.contract.sha256:
        config.append({"name": pred.contract.path or "contract", "digest": {"sha256": pred.contract.sha256}})
    if pred.tracked_sha256:
        config.append({"name": pred.tracked_file or "tracked_reds", "digest": {"sha256": pred.tracked_sha256}})
    return config


def _result(pred: Predicate) -> str:
    if pred.verdict.exit_code != 0:
        return "FAILED"
    if pred.tally.tracked_red or pred.tally.stale_tracked:
        return "WARNED"
    return "PASSED"


def result_predicate(pred: Predicate) -> dict[str, Any]:
    passed, warned, failed = [], [], []
    for rec in pred.cells:
        status = rec.result.status
        cid = rec.result.key.id
        if status.value == "green":
            passed.append(cid)
        elif rec.untracked_red or status.value == "error":
            failed.append(cid)
        elif status.is_red:
            warned.append(cid)
        elif status.is_blocked and pred.verdict.strict:
            failed.append(cid)
    return {"result": _result(pred), "configuration": _configuration(pred), "passedTests": passed,
            "warnedTests": warned, "failedTests": failed}


def build_result_statement(pred: Predicate) -> dict[str, Any]:
    """The Test Result statement over the closeout statement's subjects."""
    return {"_type": STATEMENT_TYPE, "subject": statement_subjects(pred), "predicateType": TEST_RESULT_TYPE,
            "predicate": result_predicate(pred)}


def check_result_statement(statement: Any, pred: Predicate) -> str:
    """Raise ResultStatementError unless ``statement`` is exactly the Test Result of ``pred``; return its result."""
    if not isinstance(statement, dict) or statement.get("predicateType") != TEST_RESULT_TYPE:
        raise ResultStatementError(f"not an in-toto Test Result statement (predicateType {TEST_RESULT_TYPE})")
    expected = build_result_statement(pred)
    if statement.get("subject") != expected["subject"]:
        raise ResultStatementError("its subjects are not the evidence's")
    if statement != expected:
        raise ResultStatementError("its result or test lists do not match the evidence's cells")
    return str(expected["predicate"]["result"])
