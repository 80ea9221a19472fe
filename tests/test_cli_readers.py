"""Readers verify first: report and diff refuse tampered evidence; diff fails on lost coverage and new reds.

Issue 9: `diff` and `report` render tampered evidence without a word; `diff` exits 0 when 153 cells of
coverage were lost.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence.jsonsafe import canonical
from gradsweep.evidence.signing import write_keypair
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, write_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("readers")
    key = base / "k.pem"
    write_keypair(key)
    (base / "tracked_reds.yaml").write_text("tracked:\n  - {cell: 'b/p2/*', reason: known, fix: issue 4}\n")

    def sweep(name: str, behaviour: dict[str, str], *extra: str) -> Path:
        manifest = write_manifest(base, behaviour, ops=("a", "b", "c"))
        out = base / f"{name}.json"
        result = CliRunner().invoke(app, ["sweep", str(manifest), "-o", str(out), "--key", str(key),
                                          "--no-progress", *extra, *FAKES])
        assert result.exit_code in (0, 1), result.stderr
        return out

    old = sweep("old", {"b/p2/x": "blocked"})
    fewer = sweep("fewer", {"b/p2/x": "blocked"}, "--op", "a")
    tracked_red = sweep("tracked_red", {"b/p2/*": "red"})
    doc = json.loads(old.read_bytes())
    statement = json.loads(base64.b64decode(doc["payload"]))
    for cell in statement["predicate"]["cells"]:
        cell["result"]["status"] = "green"
    doc["payload"] = base64.b64encode(canonical(statement)).decode()
    tampered = base / "tampered.json"
    tampered.write_bytes(canonical(doc))
    return {"old": old, "fewer": fewer, "tracked_red": tracked_red, "tampered": tampered,
            "trust": base / "k.pub.pem"}


def _run(world: dict[str, Path], *args: str):
    return CliRunner().invoke(app, [*args, "--trusted-key", str(world["trust"])])


@pytest.mark.parametrize("fmt", ["table", "md", "junit"])
def test_report_refuses_tampered_evidence(world: dict[str, Path], fmt: str) -> None:
    refused = _run(world, "report", str(world["tampered"]), "-f", fmt)
    assert refused.exit_code == 1 and not refused.stdout
    assert "BAD SIGNATURE" in refused.stderr and "--allow-unverified" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    flagged = _run(world, "report", str(world["tampered"]), "-f", fmt, "--allow-unverified")
    assert flagged.exit_code == 0
    assert "UNVERIFIED" in flagged.stdout and "UNVERIFIED" in flagged.stderr


def test_report_of_good_evidence_says_who_signed(world: dict[str, Path]) -> None:
    shown = _run(world, "report", str(world["old"]), "-f", "md")
    assert shown.exit_code == 0 and "verified: signed by k.pub.pem" in shown.stdout
    assert "UNVERIFIED" not in shown.stdout


def test_report_and_diff_refuse_an_untrusted_signer(world: dict[str, Path], tmp_path: Path) -> None:
    write_keypair(tmp_path / "other.pem")
    for args in (["report", str(world["old"])], ["diff", str(world["old"]), str(world["old"])]):
        result = CliRunner().invoke(app, [*args, "--trusted-key", str(tmp_path / "other.pub.pem")])
        assert result.exit_code == 1 and "untrusted key" in result.stderr, args


def test_diff_refuses_tampered_evidence(world: dict[str, Path]) -> None:
    refused = _run(world, "diff", str(world["old"]), str(world["tampered"]))
    assert refused.exit_code == 1 and "BAD SIGNATURE" in refused.stderr and not refused.stdout
    flagged = _run(world, "diff", str(world["old"]), str(world["tampered"]), "--allow-unverified")
    assert "WARNING: UNVERIFIED EVIDENCE" in flagged.stdout


def test_diff_fails_on_lost_coverage(world: dict[str, Path]) -> None:
    result = _run(world, "diff", str(world["old"]), str(world["fewer"]))
    assert result.exit_code == 1, result.stdout
    assert "LOST COVERAGE (7):" in result.stdout and "b/p1/x: green -> absent" in result.stdout
    assert "FAIL: 0 regression(s), 7 cell(s) of lost coverage" in result.stdout
    gained = _run(world, "diff", str(world["fewer"]), str(world["old"]))
    assert gained.exit_code == 0 and "NEW (8):" in gained.stdout


def test_diff_fails_on_new_reds_even_tracked(world: dict[str, Path]) -> None:
    result = _run(world, "diff", str(world["old"]), str(world["tracked_red"]))
    assert result.exit_code == 1
    assert "b/p2/x: blocked_hardware -> red_verdict (tracked)" in result.stdout
    assert "b/p2/y: green -> red_verdict (tracked)" in result.stdout and "REGRESSION (2)" in result.stdout
    same = _run(world, "diff", str(world["old"]), str(world["old"]))
    assert same.exit_code == 0 and "no status changes" in same.stdout
