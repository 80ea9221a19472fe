"""Drift outputs: JSON, table, PNG and signed evidence over all of them (tampering is detected), and the
``gradsweep drift`` command (bad input is one line, exit 2; a run writes every output)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.drift import DriftPlan, Pair, Role, run_drift_plan
from gradsweep.drift.evidence import DriftEvidenceError, verify_drift
from gradsweep.drift.outputs import write_outputs
from gradsweep.evidence.signing import public_path_for, write_keypair
from gradsweep.evidence.trust import ad_hoc_signers
from gradsweep.manifest import load_manifest
from gradsweep.nn.qwen3 import Qwen3Shape
from tests.test_drift import manifest_file

TORCH = "torch_bf16"


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    write_keypair(tmp_path / "k.pem")
    return tmp_path / "k.pem"


@pytest.fixture
def written(tmp_path: Path, key: Path):
    m = load_manifest(manifest_file(tmp_path))
    plan = DriftPlan(m, Qwen3Shape(layers=1), [Pair(Role(TORCH, "bn_full"), Role(TORCH, "decode"))], rl=True)
    report = run_drift_plan(plan)
    return report, write_outputs(report, tmp_path / "out", key)


def test_every_output_is_written_and_the_evidence_verifies(written, key: Path):
    report, files = written
    assert set(files) == {"plot", "json", "table", "evidence"}
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(files["json"].read_text())["schema"] == "gradsweep.drift/v1"
    assert "Bitwise claims" in files["table"].read_text()
    predicate = verify_drift(files["evidence"], ad_hoc_signers([public_path_for(key)]))
    assert set(predicate["artifacts"]) == {"drift.png", "drift.json", "drift.table.txt"}
    assert predicate["report"]["pairs"][0]["id"] == report["pairs"][0]["id"]
    assert predicate["provenance"]["python"]


def test_a_changed_artifact_is_detected(written, key: Path):
    _, files = written
    files["json"].write_text(files["json"].read_text().replace('"bitwise"', '"parity"', 1))
    with pytest.raises(DriftEvidenceError, match=r"drift\.json is missing or was changed"):
        verify_drift(files["evidence"], ad_hoc_signers([public_path_for(key)]))


def test_a_changed_envelope_or_an_untrusted_key_is_refused(written, key: Path, tmp_path: Path):
    _, files = written
    other = tmp_path / "other.pem"
    write_keypair(other)
    with pytest.raises(DriftEvidenceError, match="untrusted key"):
        verify_drift(files["evidence"], ad_hoc_signers([public_path_for(other)]))
    data = bytearray(files["evidence"].read_bytes())
    data[len(data) // 2] ^= 1
    files["evidence"].write_bytes(bytes(data))
    with pytest.raises(DriftEvidenceError):
        verify_drift(files["evidence"], ad_hoc_signers([public_path_for(key)]))


@pytest.mark.parametrize("args, needle", [
    (["--profile", "nope"], "--profile: unknown profile 'nope'"),
    (["--train", "bn_sideways"], "--train: 'bn_sideways' is not a layout"),
    (["--layers", "0"], "--layers must be positive"),
    (["--hidden", "30", "--layers", "1"], None),  # a valid shape override (heads x head_dim need not be hidden)
])
def test_bad_input_is_one_line(tmp_path: Path, key: Path, args, needle):
    manifest = manifest_file(tmp_path)
    if needle is None:
        done = CliRunner().invoke(app, ["drift", "--manifest", str(manifest), "--no-dlogp", "--no-rl", *args])
        assert done.exit_code in (0, 1), done.stderr
        return
    done = CliRunner().invoke(app, ["drift", "--manifest", str(manifest), *args])
    assert done.exit_code == 2 and done.stderr.startswith(f"gradsweep: error: {needle}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_command_writes_every_output(tmp_path: Path, key: Path):
    manifest = manifest_file(tmp_path)
    out = tmp_path / "out"
    done = CliRunner().invoke(app, ["drift", "--manifest", str(manifest), "--profile", TORCH, "--layers", "1",
                                    "--out", str(out), "--key", str(key), "--json"])
    report = json.loads(done.stdout)
    expected = 1 if report["pairs"][0]["first_difference"] else 0  # whatever stock torch does here
    assert done.exit_code == expected, done.stderr
    assert {p.name for p in out.iterdir()} == {"drift.json", "drift.png", "drift.table.txt", "drift.evidence.json"}
    verify_drift(out / "drift.evidence.json", ad_hoc_signers([public_path_for(key)]))


def test_gradsweep_verify_reads_drift_evidence(written, key: Path):
    """`gradsweep verify` takes drift evidence too: signature, artifacts, then the source tree (fresh here)."""
    _, files = written
    runner = CliRunner()
    ok = runner.invoke(app, ["verify", str(files["evidence"]), "--trusted-key", str(public_path_for(key))])
    assert ok.exit_code == 0, ok.output
    assert "drift evidence" in ok.output and "source tree same" in ok.output and "fresh" in ok.output
    assert "bn_full vs torch_bf16:decode (bitwise)" in ok.output
    recorded = json.loads(files["json"].read_text())["manifest"]["path"]
    assert not Path(recorded).is_absolute()  # evidence holds no machine paths
    files["table"].write_text("edited\n")
    bad = runner.invoke(app, ["verify", str(files["evidence"]), "--trusted-key", str(public_path_for(key))])
    assert bad.exit_code == 1 and "drift.table.txt is missing or was changed" in bad.output
