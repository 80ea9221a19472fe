"""Bench evidence end to end on the CPU, with a planted clock (the figures are the clock's, the machinery real):
signed like sweep evidence, verified by the same trust rules, tamper-evident (the envelope and the chart),
stale when an input changes, rendered by ``report`` as a table, markdown and JUnit, with a PNG chart."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gradsweep.bench.api import BenchOptions, run_bench
from gradsweep.bench.evidence import BenchEvidenceError, bench_inputs, check_bench_signature, read_bench
from gradsweep.bench.predicate import BENCH_PREDICATE
from gradsweep.bench.timing import HostTimer, Timing
from gradsweep.cli import app
from gradsweep.evidence.envelope import open_envelope
from gradsweep.evidence.signing import write_keypair
from gradsweep.evidence.trust import ad_hoc_signers
from gradsweep.evidence.verify import EvidenceError
from gradsweep.manifest import MANIFEST_DIR
from gradsweep.report.readers import verify_any_evidence as verify_evidence

MODE_MS = {"fwd": 1.0, "fwd_train": 1.25, "fwd_bwd": 3.0}


class PlantedTimer:
    """Deterministic figures: a step's mode sets its time, a family's steps take 1.5x the stock path's.
    Every call still runs once, so the real kernels and their checks are exercised."""

    kind = "planted"

    def _ms(self, fn) -> float:
        mode = getattr(fn, "mode", "fwd")
        family = getattr(getattr(fn, "candidate", None), "family", "torch")
        return MODE_MS[mode] * (1.5 if family != "torch" else 1.0)

    def e2e(self, calls):
        for fn in calls:
            fn()
        return Timing.of([self._ms(calls[0])] * 3, 1)

    def e2e_host(self, calls):
        return self.e2e(calls), Timing.of([0.5 * self._ms(calls[0])] * 3, 1)

    e2e_rounds = HostTimer.e2e_rounds  # one entry after the other, through this timer's e2e_host

    def kernels(self, calls):
        return Timing.of([0.8 * self._ms(calls[0])], 1)

    def backward_kernels(self):
        return None  # the planted clock reads no backward inside a step: bwd rows are the step minus its forward

    def host(self, fn):
        fn()
        return Timing.of([0.02], 1)

    def peak_extra_bytes(self, fn):
        fn()
        return 2**29

    def describe(self):
        return {"clock": "planted (tests)"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One bench of rms_norm and the fold planning on the CI smoke manifest, signed with a throwaway key."""
    base = tmp_path_factory.mktemp("bench")
    key = base / "keys" / "k.pem"
    write_keypair(key)
    out = base / "out" / "smoke.bench.evidence.json"
    opts = BenchOptions(manifest=MANIFEST_DIR / "ci_smoke.yaml", ops=["rms_norm", "fold_plan"], out=out, key=key,
                        quick=True, timer=PlantedTimer(), argv=["gradsweep", "bench", "--quick"])
    outcome = run_bench(opts)
    return outcome, key, base


def _signers(key: Path):
    return ad_hoc_signers([key.with_name("k.pub.pem")])


def test_the_run_is_signed_bench_evidence_with_figures_checks_and_targets(run):
    outcome, key, _ = run
    assert outcome.exit_code == 0
    pred, signers = check_bench_signature(outcome.out, _signers(key))
    assert [s.name for s in signers] == ["k.pub.pem"]
    statement = json.loads(base64.b64decode(json.loads(outcome.out.read_text())["payload"]))
    assert statement["predicateType"] == BENCH_PREDICATE
    assert [s["name"] for s in statement["subject"]] == ["manifest:ci_smoke", "source-tree:csrc+gradsweep"]
    assert not pred.claims_figures and pred.runs[0].quick and pred.runs[0].provenance.python
    assert pred.ceilings is not None and pred.targets.path == "manifests/bench_targets.yaml"
    from gradsweep.evidence.extension import planner_digest  # the timed folds' planner is pinned, when built
    from gradsweep.evidence.source_digest import repo_root
    built = planner_digest(repo_root())
    assert (pred.planner and (pred.planner.path, pred.planner.sha256)) == \
        (built and (built[0].relative_to(repo_root()).as_posix(), built[1])), pred.planner
    bwd = next(c for c in pred.cases if c.id == "rms_norm/bwd")
    assert bwd.shape == {"hidden": 64, "eps": 1e-6} and bwd.lengths == [9, 3, 14]
    fam = bwd.families["triton"]
    assert fam.status == "ok" and fam.profile == "triton_interpret" and fam.impl == "triton.rms_norm"
    # bwd = (fwd_bwd - fwd_train): family 1.5 * 1.75, stock 1.75
    assert fam.measured.e2e_ms == 1.5 * (3.0 - 1.25) and bwd.references["stock"].e2e_ms == 3.0 - 1.25
    assert fam.metrics["e2e_vs_stock"] == 1.5
    # the host issue time (planted: half of each mode's e2e) settles per phase like e2e, and its ratio is kept
    assert fam.measured.issue_ms == 0.5 * fam.measured.e2e_ms and fam.metrics["host_vs_e2e"] == 0.5
    assert bwd.references["stock"].issue_ms == 0.5 * (3.0 - 1.25)
    target = next(t for t in fam.targets if t.metric == "e2e_vs_stock")
    assert (target.bound, target.met, target.issue) == (1.0, False, "13")
    assert bwd.references["liger"].status in ("absent", "ok")
    kinds = sorted(c.kind for c in fam.checks)
    assert kinds == ["bitwise", "contract"] and all(c.passed for c in fam.checks)
    plan = next(c for c in pred.cases if c.id == "fold_plan/chunked")
    host = plan.families["triton"]  # the family's own fold call (take_tiles, its piece copy)
    assert host.metrics["host_us"] == 0.02 * 1e3 / 3 and host.targets[0].met is True
    from gradsweep.canonical import planner  # the plan's host time says which call and planner it timed
    assert host.impl == f"gradsweep.canonical.CanonicalFold.take_tiles + triton copy_pieces (planner: {planner()})", \
        host.impl
    assert set(plan.families) == {"triton"}  # ci_smoke declares no CUDA profile: no row for that family
    assert pred.summary.targets_missed >= 1 and pred.summary.checks_failed == 0
    assert pred.verdict.exit_code == 0 and pred.verdict.summary.startswith("RAN")


def test_a_row_without_a_target_shows_its_own_figure(run):
    """The warm fold plan has no target and no stock ratio: its row shows its host microseconds, not "-"."""
    from gradsweep.report.bench import readme_block

    outcome, key, _ = run
    pred, _ = check_bench_signature(outcome.out, _signers(key))
    warm = pred.cases[[c.id for c in pred.cases].index("fold_plan/packed_warm")].families["triton"]
    assert not warm.targets and "e2e_vs_stock" not in warm.metrics
    row = next(r for r in readme_block(pred, "x.json").splitlines() if "| fold_plan |" in r and "warm" in r)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "host_us" and cells[4] == f"{warm.metrics['host_us']:.0f} us", row
    assert cells[6] == "-", row  # a host-only case has no issue-time column figure


def test_rows_show_the_host_share_of_the_end_to_end_time(run):
    """The end-to-end row of a timed family carries host / e2e (planted: issue = half of e2e)."""
    from gradsweep.report.bench import readme_block

    outcome, key, _ = run
    pred, _ = check_bench_signature(outcome.out, _signers(key))
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in readme_block(pred, "x.json").splitlines()
            if r.startswith("| rms_norm |") and "| triton |" in r]
    assert rows and all(cells[6] == "0.50x" for cells in rows), rows  # every row's e2e side: copy, stock
    assert {"e2e_vs_stock", "copy_fraction"} <= {cells[3] for cells in rows}, rows


def test_chart_is_a_png_beside_the_evidence_under_its_digest(run):
    outcome, _, _ = run
    assert outcome.chart == outcome.out.with_name("smoke.bench.png")
    assert outcome.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert outcome.predicate.chart.file == "smoke.bench.png" and outcome.predicate.chart.sha256


def test_verify_accepts_bench_evidence_and_reports_every_input(run):
    outcome, key, _ = run
    report = verify_evidence(outcome.out, _signers(key))
    assert report.kind == "bench"
    states = {c.name: c.state for c in report.checks}
    assert states["source tree"] == states["manifest"] == states["targets"] == states["contract"] == "same"
    assert states["chart"] == "same"
    result = CliRunner().invoke(app, ["verify", str(outcome.out), "--trusted-key", str(key.with_name("k.pub.pem"))])
    assert result.exit_code == 0, result.output
    assert "bench evidence of manifest ci_smoke" in result.output and "targets same" in result.output


def test_verify_refuses_untrusted_and_tampered_evidence(run, tmp_path):
    outcome, key, _ = run
    other = tmp_path / "other.pem"
    write_keypair(other)
    with pytest.raises(EvidenceError, match="untrusted key"):
        verify_evidence(outcome.out, ad_hoc_signers([tmp_path / "other.pub.pem"]))
    edited = tmp_path / outcome.out.name
    doc = json.loads(outcome.out.read_text())
    payload = json.loads(base64.b64decode(doc["payload"]))
    payload["predicate"]["cases"][0]["families"]["triton"]["metrics"]["copy_fraction"] = 0.99
    doc["payload"] = base64.b64encode(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).decode()
    edited.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))
    shutil.copy(outcome.chart, tmp_path / outcome.chart.name)
    with pytest.raises(EvidenceError, match="BAD SIGNATURE"):
        verify_evidence(edited, _signers(key))
    raw = bytearray(outcome.out.read_bytes())
    raw[-3:-2] = b" "
    (tmp_path / "broken.evidence.json").write_bytes(bytes(raw))
    with pytest.raises((EvidenceError, BenchEvidenceError)):
        check_bench_signature(tmp_path / "broken.evidence.json", _signers(key))


def test_an_edited_chart_is_refused(run, tmp_path):
    outcome, key, _ = run
    shutil.copy(outcome.out, tmp_path / outcome.out.name)
    (tmp_path / outcome.chart.name).write_bytes(outcome.chart.read_bytes() + b"\0")
    with pytest.raises(EvidenceError, match=r"chart smoke\.bench\.png was changed after signing"):
        verify_evidence(tmp_path / outcome.out.name, _signers(key))
    (tmp_path / outcome.chart.name).unlink()
    report = verify_evidence(tmp_path / outcome.out.name, _signers(key))  # moved alone: not compared, not failed
    assert {c.name: c.state for c in report.checks}["chart"] == "not compared"


def test_stale_when_an_input_of_the_figures_changes(run, tmp_path):
    outcome, _, _ = run
    pred = read_bench(outcome.out)
    root = Path(__file__).resolve().parents[1]
    tree = tmp_path / "tree"
    for sub in ("manifests", "csrc", "gradsweep"):
        shutil.copytree(root / sub, tree / sub, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    targets = yaml.safe_load((tree / "manifests" / "bench_targets.yaml").read_text())
    targets["version"] += 1
    (tree / "manifests" / "bench_targets.yaml").write_text(yaml.safe_dump(targets))
    states = {c.name: c.state for c in bench_inputs(pred, tree)}
    assert states["targets"] == "differs" and states["manifest"] == "same" and states["source tree"] == "same"


def test_report_renders_bench_evidence_after_verifying(run, tmp_path):
    outcome, key, _ = run
    pub = str(key.with_name("k.pub.pem"))
    runner = CliRunner()
    table = runner.invoke(app, ["report", str(outcome.out), "--trusted-key", pub])
    assert table.exit_code == 0, table.output
    assert "gradsweep bench: ci_smoke" in table.output and "SMOKE RUN" in table.output
    assert "e2e_vs_stock <= 1.00x: 1.50x MISSED (#13)" in table.output
    md = runner.invoke(app, ["report", str(outcome.out), "--format", "md", "--trusted-key", pub])
    head = "| op | case | family | metric | end to end | kernels only | host / e2e | target | |"
    assert md.exit_code == 0 and head in md.output
    assert "| rms_norm | bwd 26 x 64 (dx + canonical dweight) | triton | e2e_vs_stock | 1.50x |" in md.output
    junit = tmp_path / "bench.xml"
    done = runner.invoke(app, ["report", str(outcome.out), "--format", "junit", "-o", str(junit), "--trusted-key", pub])
    assert done.exit_code == 0 and 'name="bench.triton"' in junit.read_text()
    refused = runner.invoke(app, ["report", str(outcome.out)])  # not in the trust file: readers verify first
    assert refused.exit_code == 1 and "untrusted key" in refused.output
    flagged = runner.invoke(app, ["report", str(outcome.out), "--allow-unverified"])
    assert flagged.exit_code == 0 and "UNVERIFIED" in flagged.output
    overwrite = runner.invoke(app, ["report", str(outcome.out), "-o", str(outcome.out), "--trusted-key", pub])
    assert overwrite.exit_code == 2


def test_the_envelope_is_the_sweeps(run):
    outcome, _, _ = run
    envelope = open_envelope(outcome.out.read_bytes())  # strict canonical parser of sweep evidence
    assert envelope.payload_type == "application/vnd.in-toto+json" and len(envelope.signatures) == 1


def test_readme_table_is_regenerated_between_the_markers_only(run, tmp_path):
    from gradsweep.report.bench_readme import BEGIN, END, ReadmeError, main, splice

    outcome, key, _ = run
    pub = str(key.with_name("k.pub.pem"))
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    assert main([str(outcome.out), "--readme", str(readme), "--trusted-key", pub]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith(f"{END}\nafter\n") and "old table" not in text
    assert "| rms_norm | bwd 26 x 64 (dx + canonical dweight) | triton | e2e_vs_stock | 1.50x |" in text
    assert "SMOKE RUN" in text
    assert main([str(outcome.out), "--readme", str(readme)]) == 1  # not in the trust file: nothing written
    readme.write_text("no markers\n")
    assert main([str(outcome.out), "--readme", str(readme), "--trusted-key", pub]) == 2
    assert readme.read_text() == "no markers\n"
    tables = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
    assert "new block" in splice(tables.read_text(), "new block\n")  # docs/performance.md carries the markers
    two = tmp_path / "two.md"  # several evidence files (one per bench group): their tables in the order given
    two.write_text(f"{BEGIN}\n{END}\n")
    assert main([str(outcome.out), str(outcome.out), "--readme", str(two), "--trusted-key", pub]) == 0
    assert two.read_text().count("| rms_norm | bwd 26 x 64 (dx + canonical dweight) | triton | e2e_vs_stock |") == 2
    with pytest.raises(ReadmeError):
        splice(f"{END}\n{BEGIN}\n", "x")


def test_without_matplotlib_the_chart_is_skipped_with_a_message(run, tmp_path, monkeypatch):
    import sys

    from gradsweep.bench import api

    outcome, _, _ = run
    said: list[str] = []
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    ref = api._chart(outcome.predicate, tmp_path / "c.png", tmp_path / "e.json", said.append)
    assert ref.file is None and "matplotlib is not installed" in ref.reason and said == [ref.reason]
    assert not (tmp_path / "c.png").exists()
