"""A cell's one-line detail names each failure once (the first failure opens the reason)."""

from gradsweep.evidence.predicate import CellRecord
from gradsweep.report.labels import detail
from gradsweep.results import CellKey, CellResult, Status


def _rec(reason: str, first: str | None) -> CellRecord:
    key = CellKey(op="rms_norm", profile="p", layout="bn_chunked")
    return CellRecord(result=CellResult(key=key, status=Status.RED_VERDICT, reason=reason, first_failure=first))


def test_first_failure_is_printed_once():
    first = "dW gradient_invariance: 3 elements differ"
    text = detail(_rec(f"{first}; dX gradient_accuracy: error 1 > bound 0.1", first))
    assert text.count(first) == 1 and "dX gradient_accuracy" in text


def test_reason_and_first_failure_that_differ_are_both_shown():
    assert detail(_rec("adapter: wrong rows", "y: 3 rows returned")) == "y: 3 rows returned; adapter: wrong rows"
