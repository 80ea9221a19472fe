"""The in-toto Statement v1 around a predicate: subjects are the manifest file and the source tree."""

from __future__ import annotations

from typing import Any

from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.evidence.predicate import PREDICATE_TYPE, Predicate

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SOURCE_SUBJECT = "source-tree:csrc+gradsweep"


class StatementError(ValueError):
    """A payload that is not a gradsweep closeout statement."""


def statement_subjects(predicate: Predicate) -> list[dict[str, Any]]:
    """What the evidence is about: the manifest file and the source tree (shared by every statement)."""
    return [
        {"name": f"manifest:{predicate.manifest.name}", "digest": {"sha256": predicate.manifest.sha256}},
        {"name": SOURCE_SUBJECT, "digest": {"sha256": predicate.source.sha256}},
    ]


def build_statement(predicate: Predicate) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": statement_subjects(predicate), "predicateType": PREDICATE_TYPE,
            "predicate": jsonable(predicate.model_dump(mode="python"))}


def parse_statement(statement: Any) -> Predicate:
    """Check the Statement envelope fields and subjects, return the typed predicate."""
    if not isinstance(statement, dict):
        raise StatementError("payload is not a JSON object")
    if statement.get("_type") != STATEMENT_TYPE:
        raise StatementError(f"payload _type is {statement.get('_type')!r}, expected {STATEMENT_TYPE}")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise StatementError(f"predicateType is {statement.get('predicateType')!r}, "
                             f"expected {PREDICATE_TYPE}")
    try:
        predicate = Predicate.model_validate(statement.get("predicate"))
    except ValueError as exc:
        raise StatementError(f"predicate does not match the closeout schema: {exc}") from None
    if statement.get("subject") != build_statement(predicate)["subject"]:
        raise StatementError("subjects do not match the predicate's manifest and source digests")
    return predicate
