"""scripts/evidence_bits_moved.py: the before / after check of a bits-preserving change, read from two signed sweep
evidence files (each tensor's recorded error against the FP64 reference moves when its bits do)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence.signing import write_keypair
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest

spec = importlib.util.spec_from_file_location("evidence_bits_moved", REPO / "scripts" / "evidence_bits_moved.py")
moved = importlib.util.module_from_spec(spec)
spec.loader.exec_module(moved)


def _sweep(tmp_path: Path, key: Path, out: str, monkeypatch: pytest.MonkeyPatch, planted: str) -> Path:
    monkeypatch.setenv("FAKE_ACCURACY_ERROR", planted)
    manifest = write_manifest(tmp_path)
    path = tmp_path / out
    result = CliRunner().invoke(app, ["sweep", str(manifest), "-o", str(path), "--key", str(key), "--no-progress",
                                      "--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER])
    assert result.exit_code == 0, result.stderr
    return path


def test_a_moved_output_is_named_and_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    key = tmp_path / "k.pem"
    write_keypair(key)
    pub = tmp_path / "k.pub.pem"
    before = _sweep(tmp_path, key, "before.evidence.json", monkeypatch, "")
    after = _sweep(tmp_path, key, "after.evidence.json", monkeypatch, "a:0.25")
    trust = ["--trusted-key", str(pub)]
    assert moved.main([str(before), str(after), *trust]) == 1
    out = capsys.readouterr().out
    assert out.count("moved  a/") == 4 and "moved  b/" not in out and "4 of 8 tensors moved" in out
    assert moved.main([str(before), str(after), "--op", "b", *trust]) == 0
    assert moved.main([str(before), str(before), *trust]) == 0
    assert moved.main([str(before), str(after), "--op", "zz", *trust]) == 2


def test_unverified_evidence_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    key, other = tmp_path / "k.pem", tmp_path / "o.pem"
    write_keypair(key)
    write_keypair(other)
    ev = _sweep(tmp_path, key, "e.evidence.json", monkeypatch, "")
    assert moved.main([str(ev), str(ev), "--trusted-key", str(tmp_path / "o.pub.pem")]) == 3
    assert "untrusted key" in capsys.readouterr().err
