"""Signed evidence: any changed byte, a wrong key or another tree is caught by verify."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gradsweep.evidence.envelope import decode_statement, open_envelope  # noqa: E402
from gradsweep.evidence.freshness import stale_checks  # noqa: E402
from gradsweep.evidence.jsonsafe import canonical  # noqa: E402
from gradsweep.evidence.signing import public_path_for, write_keypair  # noqa: E402
from gradsweep.evidence.trust import ad_hoc_signers  # noqa: E402
from gradsweep.evidence.verify import (  # noqa: E402
    EvidenceError,
    check_signature,
    check_signature_bytes,
    verify_evidence,
)
from gradsweep.sweep.api import SweepOptions, execute_sweep, prepare_sweep  # noqa: E402
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, write_manifest  # noqa: E402


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("evidence")
    tree = base / "tree"
    (tree / "gradsweep").mkdir(parents=True)
    (tree / "gradsweep" / "kernel.py").write_text("x = 1\n")
    key = base / "keys" / "signer.pem"
    write_keypair(key)
    manifest = write_manifest(base, {"a/p1/y": "red", "b/p2/x": "blocked"})
    opts = SweepOptions(manifest=manifest, out=base / "ev.json", key=key, cell_fn=FAKE_CELL,
                        loader=FAKE_LOADER, tree=tree, jobs=2, argv=["gradsweep", "sweep"])
    outcome = execute_sweep(prepare_sweep(opts, lambda _m: None))
    assert outcome.out.is_file()
    return {"evidence": outcome.out, "key": key, "pub": public_path_for(key), "tree": tree, "base": base}


def _trusted(signed: dict[str, Path]) -> list:
    return ad_hoc_signers([signed["pub"]])


def _stale(report) -> bool:
    return bool(stale_checks(report.checks))


def test_valid_evidence_verifies_and_is_fresh(signed: dict[str, Path]) -> None:
    report = verify_evidence(signed["evidence"], _trusted(signed), signed["tree"])
    assert not _stale(report)
    assert [s.name for s in report.signers] == [signed["pub"].name]
    statuses = {c.result.key.id: c.result.status.value for c in report.predicate.cells}
    assert statuses["a/p1/y"] == "red_verdict" and statuses["b/p2/x"] == "blocked_hardware"
    assert len(statuses) == 8


def test_statement_shape(signed: dict[str, Path]) -> None:
    statement = decode_statement(open_envelope(signed["evidence"].read_bytes()).payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://gradsweep.dev/closeout/v1"
    assert [s["name"].split(":")[0] for s in statement["subject"]] == ["manifest", "source-tree"]
    doc = json.loads(signed["evidence"].read_bytes())
    assert doc["payloadType"] == "application/vnd.in-toto+json"
    pred = statement["predicate"]
    assert pred["runs"][0]["provenance"]["python"]
    assert pred["tally"]["untracked_red"] == 1


def test_every_single_byte_tamper_fails(signed: dict[str, Path], tmp_path: Path) -> None:
    data = signed["evidence"].read_bytes()
    trusted = _trusted(signed)
    check_signature_bytes(data, trusted)
    for i in range(len(data)):
        for flip in (0x01,) if i % 11 else (0x01, 0x20):
            tampered = bytearray(data)
            tampered[i] ^= flip
            with pytest.raises(EvidenceError):
                check_signature_bytes(bytes(tampered), trusted)
    for extra in (b"\n", b" ", b"\x00"):
        with pytest.raises(EvidenceError):
            check_signature_bytes(data + extra, trusted)
    bad = tmp_path / "bad.json"
    bad.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.raises(EvidenceError):
        check_signature(bad, trusted)


def test_edited_payload_with_old_signature_fails(signed: dict[str, Path], tmp_path: Path) -> None:
    doc = json.loads(signed["evidence"].read_bytes())
    statement = json.loads(base64.b64decode(doc["payload"]))
    for cell in statement["predicate"]["cells"]:
        cell["result"]["status"] = "green"
    doc["payload"] = base64.b64encode(canonical(statement)).decode()
    bad = tmp_path / "edited.json"
    bad.write_bytes(canonical(doc))
    with pytest.raises(EvidenceError, match="BAD SIGNATURE"):
        check_signature(bad, _trusted(signed))


def test_wrong_key_fails(signed: dict[str, Path], tmp_path: Path) -> None:
    other = write_keypair(tmp_path / "other.pem")
    with pytest.raises(EvidenceError, match="untrusted key"):
        check_signature(signed["evidence"], ad_hoc_signers([tmp_path / "other.pub.pem"]))
    # a signature by the other key that claims the trusted key's id
    from securesystemslib.dsse import Envelope

    env = open_envelope(signed["evidence"].read_bytes())
    trusted_id = next(iter(env.signatures))
    forged = Envelope(payload=env.payload, payload_type=env.payload_type, signatures={})
    sig = forged.sign(other)
    doc = forged.to_dict()
    forged_sig = base64.b64encode(bytes.fromhex(sig.signature)).decode()
    doc["signatures"] = [{"keyid": trusted_id, "sig": forged_sig}]
    bad = tmp_path / "forged.json"
    bad.write_bytes(canonical(doc))
    with pytest.raises(EvidenceError, match="BAD SIGNATURE"):
        check_signature(bad, _trusted(signed))


def test_other_tree_is_stale(signed: dict[str, Path], tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(signed["tree"], tree)
    assert not _stale(verify_evidence(signed["evidence"], _trusted(signed), tree))
    (tree / "gradsweep" / "kernel.py").write_text("x = 2\n")
    report = verify_evidence(signed["evidence"], _trusted(signed), tree)
    assert [c.name for c in stale_checks(report.checks)] == ["source tree"]
    assert _stale(verify_evidence(signed["evidence"], _trusted(signed), REPO))


def test_cli_verify_exit_codes(signed: dict[str, Path], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gradsweep.cli import app

    runner = CliRunner()
    base = ["verify", str(signed["evidence"]), "--trusted-key", str(signed["pub"])]
    ok = runner.invoke(app, [*base, "--tree", str(signed["tree"])])
    assert ok.exit_code == 0, ok.output
    assert "signature OK" in ok.stdout and "fresh" in ok.stdout
    stale = runner.invoke(app, [*base, "--tree", str(REPO)])
    assert stale.exit_code == 4 and "STALE" in stale.stderr
    assert runner.invoke(app, [*base, "--tree", str(REPO), "--allow-stale"]).exit_code == 0
    data = bytearray(signed["evidence"].read_bytes())
    data[len(data) // 2] ^= 0x04
    bad = tmp_path / "bad.json"
    bad.write_bytes(bytes(data))
    tampered = runner.invoke(app, ["verify", str(bad), "--trusted-key", str(signed["pub"])])
    assert tampered.exit_code == 1 and len(tampered.stderr.strip().splitlines()) == 1
    write_keypair(tmp_path / "k2.pem")
    wrong = runner.invoke(app, ["verify", str(signed["evidence"]), "--trusted-key",
                                str(tmp_path / "k2.pub.pem")])
    assert wrong.exit_code == 1 and "untrusted key" in wrong.stderr
