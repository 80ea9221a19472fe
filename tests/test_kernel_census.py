"""scripts/kernel_census.py --missed-from picks exactly the bench cases a signed file records a missed target for:
the same cases docs/performance.md (generated from that evidence) marks **missed**, no more (a met case would
spend the closeout's last device seconds on a profile nobody needs), no fewer (a missed row would come back
without the profile that explains it)."""

from __future__ import annotations

from pathlib import Path

from gradsweep.bench.evidence import read_bench
from scripts.kernel_census import missed_cases

REPO = Path(__file__).resolve().parents[1]
BENCH = sorted((REPO / "evidence" / "bench").glob("h200.bench-*.evidence.json"))


def _docs_missed() -> set[tuple[str, str]]:
    """(op, case title) of every row docs/performance.md marks missed."""
    out = set()
    for line in (REPO / "docs" / "performance.md").read_text().splitlines():
        if line.startswith("| ") and line.rstrip().endswith("| **missed** |"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            out.add((cells[0], cells[1].replace("\\|", "|")))
    return out


def test_missed_cases_are_the_rows_the_docs_mark_missed() -> None:
    ops, ids = missed_cases(BENCH)
    titles = {case.id: (case.op, case.title) for path in BENCH for case in read_bench(path).cases}
    assert {titles[i] for i in ids} == _docs_missed()
    assert ops == sorted({titles[i][0] for i in ids})


def test_a_file_without_a_missed_target_gives_nothing() -> None:
    met = [p for p in BENCH if not any(t.met is False for c in read_bench(p).cases
                                       for f in c.families.values() for t in f.targets)]
    assert met, "every committed bench file misses a target: this test needs one that does not"
    assert missed_cases(met) == ([], [])


def test_missed_ids_select_those_cases_only() -> None:
    """The census hands its ids to ``case_steps`` as whole ids: ``det_gemm/dx_m1`` builds that case alone, where the
    substring filter the other probes use also matches dx_m16 and dx_m16384 (device time the closeout lacks)."""
    import torch

    from scripts.probe_cases import case_steps

    def ids(exact: bool) -> list[str]:
        return [f.case.id for f in case_steps("manifests/h200.yaml", ["det_gemm"], ["det_gemm/dx_m1"],
                                              torch.device("cpu"), exact=exact) if not isinstance(f, tuple)]

    assert ids(True) == ["det_gemm/dx_m1"]
    assert ids(False) == ["det_gemm/dx_m1", "det_gemm/dx_m16", "det_gemm/dx_m16384"]
