"""The CLI end to end with fake cells: sweep, verify, report, diff, merge, check, list, schema, keygen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return {"dir": tmp_path, "pub": tmp_path / "cfg" / "gradsweep" / "signing-key.pub.pem"}


def _sweep(*args: str) -> object:
    return CliRunner().invoke(app, ["sweep", *args, *FAKES, "--no-progress"])


def test_sweep_verify_report_diff(env: dict[str, Path]) -> None:
    d = env["dir"]
    manifest = write_manifest(d, {"a/p1/y": "red", "b/p2/*": "blocked", "b/p1/x": "skipped"})
    (d / "tracked_reds.yaml").write_text(
        "tracked:\n  - {cell: a/p1/y, reason: planted, fix: issue 1}\n"
        "  - {cell: a/p2/x, reason: old, fix: PR 2}\n")
    first = _sweep(str(manifest), "-o", "old.json")
    assert first.exit_code == 0, first.stderr
    assert "created signing key" in first.stderr and env["pub"].is_file()
    assert "red (t)" in first.stdout and "STALE tracked entry a/p2/x" in first.stdout
    assert "[8/8]" in first.stderr
    assert (d / "old.json").is_file() and not (d / "old.json.partial.jsonl").exists()
    strict = _sweep(str(manifest), "-o", "strict.json", "--strict")
    assert strict.exit_code == 1 and "--strict" in strict.stdout

    runner = CliRunner()
    trust = ["--trusted-key", str(env["pub"])]  # your own key is trusted only when you say so
    verified = runner.invoke(app, ["verify", "old.json", "--allow-stale", *trust])
    assert verified.exit_code == 0 and "signature OK" in verified.stdout

    md = runner.invoke(app, ["report", "old.json", "--format", "md", *trust])
    assert md.exit_code == 0 and "| op | layout | p1 | p2 |" in md.stdout and "🟡" in md.stdout
    junit = runner.invoke(app, ["report", "old.json", "-f", "junit", "-o", "j.xml", *trust])
    assert junit.exit_code == 0
    root = ET.parse(d / "j.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 8
    assert len(root.findall(".//failure")) == 1 and len(root.findall(".//skipped")) == 3
    table = runner.invoke(app, ["report", "old.json", *trust])
    assert table.exit_code == 0 and "gradsweep matrix: tiny" in table.stdout

    (d / "tracked_reds.yaml").write_text("tracked: []\n")
    manifest = write_manifest(d, {"a/p1/y": "green", "a/p2/y": "red", "b/p2/x": "raise"})
    second = _sweep(str(manifest), "-o", "new.json")
    assert second.exit_code == 1 and "RED (U)" in second.stdout
    diff = runner.invoke(app, ["diff", "old.json", "new.json", *trust])
    assert diff.exit_code == 1
    assert "WARNING: NON-DEFAULT CELL FUNCTION tests.fakes.cells:cell" in diff.stdout  # the fakes are flagged
    lines = [line for line in diff.stdout.splitlines() if not line.startswith("WARNING")]
    assert lines[0].startswith("REGRESSION (2)") and "a/p2/y: green -> red_verdict (UNTRACKED)" in lines[1]
    assert "b/p2/x: blocked_hardware -> error" in diff.stdout and "FIXED" in diff.stdout
    assert runner.invoke(app, ["diff", "old.json", "old.json", *trust]).exit_code == 0

    # verify judges trust; --require-pass also refuses a signed FAIL (exit 5), and passes a signed PASS
    failed = runner.invoke(app, ["verify", "new.json", "--allow-stale", *trust])
    assert failed.exit_code == 0, failed.stderr
    refused = runner.invoke(app, ["verify", "new.json", "--allow-stale", "--require-pass", *trust])
    assert refused.exit_code == 5 and "VERDICT NOT PASS: the sweep exited 1" in refused.stderr
    passed = runner.invoke(app, ["verify", "old.json", "--allow-stale", "--require-pass", *trust])
    assert passed.exit_code == 0, passed.stderr


def test_shards_merge_via_cli(env: dict[str, Path]) -> None:
    manifest = write_manifest(env["dir"], {"a/p1/y": "red"})
    (env["dir"] / "tracked_reds.yaml").write_text("tracked:\n  - {cell: '*/p1/*', reason: r, fix: f}\n")
    for k in (1, 2):
        assert _sweep(str(manifest), "--shard", f"{k}/2").exit_code == 0
    shards = sorted(str(p) for p in (env["dir"] / "out").glob("tiny.shard-*.evidence.json"))
    assert len(shards) == 2
    trust = ["--trusted-key", str(env["pub"])]
    merged = CliRunner().invoke(app, ["merge", *shards, "-o", "merged.json", *trust])
    assert merged.exit_code == 0, merged.stderr
    full = _sweep(str(manifest), "-o", "full.json")
    report = CliRunner().invoke(app, ["report", "merged.json", "-f", "md", *trust]).stdout
    assert report.split("Source")[1] == CliRunner().invoke(app, ["report", "full.json", "-f", "md", *trust]) \
        .stdout.split("Source")[1]
    assert full.exit_code == 0
    missing = CliRunner().invoke(app, ["merge", shards[0], "-o", "m2.json", *trust])
    assert missing.exit_code == 2 and "missing shard" in missing.stderr and not Path("m2.json").exists()


def test_check_one_cell(env: dict[str, Path]) -> None:
    manifest = write_manifest(env["dir"], {"a/p1/y": "red"})
    before = dict(os.environ)
    try:
        result = CliRunner().invoke(app, ["check", "--op", "a", "--profile", "p1", "--layout", "y",
                                          "--manifest", str(manifest), *FAKES])
        assert os.environ.get("GRADSWEEP_FAKE_PROFILE") == "p1"  # the profile env was applied in-process
        as_json = CliRunner().invoke(app, ["check", "--op", "a", "--profile", "p2", "--layout", "y",
                                           "--manifest", str(manifest), "--json", *FAKES])
    finally:
        os.environ.clear()
        os.environ.update(before)
    assert result.exit_code == 1 and "per-tensor diagnostics" in result.stdout
    assert "UNTRACKED" in result.stdout
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["result"]["status"] == "green"


def test_keygen_list_schema_help(env: dict[str, Path]) -> None:
    runner = CliRunner()
    made = runner.invoke(app, ["keygen", "-o", "k/mine.pem"])
    assert made.exit_code == 0 and Path("k/mine.pub.pem").is_file()
    again = runner.invoke(app, ["keygen", "-o", "k/mine.pem"])
    assert again.exit_code == 2 and "already exists" in again.stderr
    manifest = write_manifest(env["dir"], profiles=("p1", "p2", "p3"))
    listed = runner.invoke(app, ["list", "profiles", "--manifest", str(manifest),
                                 "--manifest-loader", FAKE_LOADER])
    assert listed.stdout.split() == ["p1", "p2", "p3"]
    assert runner.invoke(app, ["list", "layouts"]).exit_code == 0
    schema = runner.invoke(app, ["schema"])
    assert schema.exit_code == 0 and "manifest_version" in json.loads(schema.stdout)["properties"]
    helped = runner.invoke(app, ["--help"])
    assert "Exit codes" in helped.stdout and "nothing could run" in helped.stdout


def test_module_entry_point_runs(env: dict[str, Path]) -> None:
    done = subprocess.run([sys.executable, "-m", "gradsweep.cli", "--help"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert done.returncode == 0 and "sweep" in done.stdout


@pytest.mark.e2e
def test_real_ci_smoke_sweep(env: dict[str, Path]) -> None:
    """The real harness on manifests/ci_smoke.yaml: GPU cells blocked here, evidence verifies."""
    manifest = REPO / "manifests" / "ci_smoke.yaml"
    if not manifest.exists():
        pytest.skip("manifests/ci_smoke.yaml not present")
    result = CliRunner().invoke(app, ["sweep", str(manifest), "-o", "smoke.json", "--no-progress"])
    assert result.exit_code in (0, 1), result.stderr
    verified = CliRunner().invoke(app, ["verify", "smoke.json", "--allow-stale", "--trusted-key", str(env["pub"])])
    assert verified.exit_code == 0, verified.stderr
    from gradsweep.evidence.verify import read_evidence

    pred = read_evidence(Path("smoke.json"))
    statuses = {r.result.key.id: r.result.status.value for r in pred.cells}
    assert statuses and "error" not in statuses.values(), statuses
    import torch

    if not torch.cuda.is_available():
        gpu = [s for cid, s in statuses.items() if "cuda" in cid.split("/")[1]]
        assert gpu and all(s == "blocked_hardware" for s in gpu)
