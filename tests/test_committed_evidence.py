"""The committed evidence is what the docs say it is: every signed file is authentic under evidence/trust.yaml,
docs/performance.md is exactly what its generator makes of the committed bench evidence, and every figure the
README's performance table quotes is one the committed bench evidence holds.

Freshness against this checkout is not asserted here (a session may land code before its device run and say the
evidence is stale, as evidence/README.md does then); authenticity and the docs' agreement with it always hold.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.bench.evidence import read_bench
from gradsweep.cli import app
from gradsweep.report.bench import fmt_metric
from gradsweep.report.bench_readme import main as regenerate

REPO = Path(__file__).resolve().parents[1]
EVIDENCE = REPO / "evidence"
BENCH = sorted((EVIDENCE / "bench").glob("h200.bench-*.evidence.json"))
SIGNED = [EVIDENCE / "h200.evidence.json", *BENCH, EVIDENCE / "drift" / "drift.evidence.json"]


@pytest.mark.parametrize("path", SIGNED, ids=lambda p: p.relative_to(EVIDENCE).as_posix())
def test_every_committed_signed_file_is_authentic(path: Path) -> None:
    """Exit 0 with --allow-stale: a good signature by a key the trust file allows for the file's manifest (a
    tampered payload or an unknown key exits 1 whatever the flags)."""
    res = CliRunner().invoke(app, ["verify", str(path), "--allow-stale", "--allow-other-build"])
    assert res.exit_code == 0, res.output


def test_performance_doc_is_generated_from_the_committed_bench_evidence(tmp_path: Path) -> None:
    """docs/performance.md regenerated from evidence/bench/ in the order its header names (the glob's) is
    byte for byte the committed file: no figure there was typed by hand or left from another run."""
    doc = REPO / "docs" / "performance.md"
    copy = tmp_path / "performance.md"
    shutil.copy(doc, copy)
    assert regenerate([*map(str, BENCH), "--readme", str(copy)]) == 0
    assert copy.read_text() == doc.read_text(), "docs/performance.md differs from what the committed evidence gives"


_FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(x|%| us| GiB)(?!\w)")
_THEN = re.compile(r"\b(?:was|were)\b[^;)]*")  # "(... was 1.37x / 1.42x)": a figure of an earlier run


def _readme_perf_rows() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Performance"):]
    section = section[:section.index("\n## ", 5)]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| case")]


# which ops a README row quotes (its first cell), and which family each figure column is
_ROW_OPS = {r"\bchain\b": "chain", r"\bGEMM\b|canonical dW": "det_gemm", r"\battention\b": "attention",
            r"selected-token logp": "logp", r"\blinear_logp\b": "linear_logp", r"\brms_norm\b": "rms_norm",
            r"\bqk_norm\b": "qk_norm", r"\bRoPE\b": "rope", r"\bembedding\b": "embedding",
            r"\bswiglu\b": "swiglu", r"\bsilu\b": "silu", r"fold plan": "fold_plan"}
_COLUMNS = ("triton", "cuda")


def _evidence_figures() -> dict[tuple[str, str], set[str]]:
    """(op, family) -> every figure the committed bench files report for it, formatted as the reports format
    them (end to end, kernels only, ratios of either)."""
    out: dict[tuple[str, str], set[str]] = {}
    for path in BENCH:
        for case in read_bench(path).cases:
            for name, fam in case.families.items():
                texts = {fmt_metric(metric, value) for metric, value in fam.metrics.items()}
                out.setdefault((case.op, name), set()).update(texts)
    return out


def test_readme_performance_figures_come_from_the_evidence() -> None:
    """Each figure in a row of the README's performance table is one the committed evidence reports for that row's op in
    that column's family (Triton, CUDA), except the earlier runs' figures the row marks with "was" / "were": a
    mistyped, invented or misplaced figure fails here. Every row must name its op."""
    figures = _evidence_figures()
    missing = []
    for row in _readme_perf_rows():
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4, row
        ops = {op for pattern, op in _ROW_OPS.items() if re.search(pattern, cells[0])}
        assert ops, f"README performance row names no op this test knows: {cells[0]}"
        for family, cell in zip(_COLUMNS, cells[1:3]):
            pool = set().union(*(figures.get((op, family), set()) for op in ops))
            for value, unit in _FIGURE.findall(_THEN.sub("", cell)):
                if f"{value}{unit}" not in pool:
                    missing.append(f"{family} {value}{unit} in: {cells[0]}")
    assert not missing, "README figures the committed bench evidence does not hold:\n" + "\n".join(missing)
