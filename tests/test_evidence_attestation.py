"""Standard attestations: an in-toto Test Result beside the evidence; relative paths; CPU and BLAS.

Issue 9: committed evidence holds absolute machine paths (argv[0], predicate.contract.path, the output
path); deliver an in-toto Test Result v0.1 statement over the same subjects and CPU model / BLAS in
provenance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence import host_facts
from gradsweep.evidence.envelope import decode_statement, open_envelope
from gradsweep.evidence.jsonsafe import canonical
from gradsweep.evidence.signing import write_keypair
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("attest")
    key = base / "keys" / "signer.pem"
    write_keypair(key)
    manifest = write_manifest(base, {"a/p1/y": "red", "a/p2/x": "red", "b/p2/*": "blocked"},
                              contract_file="contract.yaml")
    (base / "contract.yaml").write_text("contract_version: fake-1\n")
    (base / "tracked_reds.yaml").write_text("tracked:\n  - {cell: a/p2/x, reason: known, fix: issue 3}\n")
    out = base / "deep" / "ev.evidence.json"
    # a real command line (argv[0] is this machine's path to the CLI), with absolute paths everywhere
    done = subprocess.run([sys.executable, "-m", "gradsweep.cli", "sweep", str(manifest), "-o", str(out),
                           "--key", str(key), "--tracked", str(base / "tracked_reds.yaml"), "--no-progress",
                           *FAKES], capture_output=True, text=True, timeout=300, cwd=base,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 1, done.stderr  # the planted untracked red
    envelope = open_envelope(out.read_bytes())
    side = out.with_name("ev.test-result.json")
    return {"base": base, "out": out, "side": side, "pub": base / "keys" / "signer.pub.pem",
            "closeout": decode_statement(envelope.payload), "keyids": list(envelope.signatures)}


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_test_result_statement_beside_the_evidence(run: dict[str, Any]) -> None:
    side: Path = run["side"]
    assert side.is_file()
    envelope = open_envelope(side.read_bytes())
    assert list(envelope.signatures) == run["keyids"], "signed by the same key"
    statement = decode_statement(envelope.payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == TEST_RESULT
    assert statement["subject"] == run["closeout"]["subject"]
    pred = statement["predicate"]
    assert pred["result"] == "FAILED"
    assert pred["failedTests"] == ["a/p1/y"] and pred["warnedTests"] == ["a/p2/x"]
    assert len(pred["passedTests"]) == 4 and "b/p2/x" not in pred["passedTests"] + pred["failedTests"]
    names = [c["name"] for c in pred["configuration"]]
    assert names == ["<external>/tiny.yaml", "<external>/contract.yaml", "<external>/tracked_reds.yaml"]
    closeout = run["closeout"]["predicate"]
    assert pred["configuration"][0]["digest"]["sha256"] == closeout["manifest"]["sha256"]
    assert pred["configuration"][1]["digest"]["sha256"] == closeout["contract"]["sha256"]


def test_verify_checks_the_test_result(run: dict[str, Any], tmp_path: Path) -> None:
    trust = ["--trusted-key", str(run["pub"])]
    ok = CliRunner().invoke(app, ["verify", str(run["out"]), "--allow-stale", *trust])
    assert ok.exit_code == 0 and "test result: FAILED" in ok.stdout
    out = tmp_path / "ev.evidence.json"
    out.write_bytes(run["out"].read_bytes())
    statement = decode_statement(open_envelope(run["side"].read_bytes()).payload)
    statement["predicate"]["result"] = "PASSED"
    from securesystemslib.signer import CryptoSigner

    from gradsweep.evidence.envelope import seal
    from gradsweep.evidence.signing import load_signer

    signer: CryptoSigner = load_signer(run["base"] / "keys" / "signer.pem")
    (tmp_path / "ev.test-result.json").write_bytes(seal(statement, signer))  # validly signed, but a lie
    lied = CliRunner().invoke(app, ["verify", str(out), "--allow-stale", *trust])
    assert lied.exit_code == 1 and "do not match the evidence" in lied.stderr


def test_no_absolute_paths_in_evidence(run: dict[str, Any]) -> None:
    for statement in (run["closeout"], decode_statement(open_envelope(run["side"].read_bytes()).payload)):
        strings = _strings(statement)
        leaked = [s for s in strings if s.startswith("/") or str(run["base"]) in s or str(REPO) in s]
        assert not leaked, leaked
    pred = run["closeout"]["predicate"]
    argv = pred["runs"][0]["argv"]
    assert argv[0] == "gradsweep" and "<external>/ev.evidence.json" in argv and "<external>/signer.pem" in argv
    assert pred["contract"]["path"] == "<external>/contract.yaml"


def test_provenance_has_cpu_model_and_blas(run: dict[str, Any]) -> None:
    prov = run["closeout"]["predicate"]["runs"][0]["provenance"]
    assert "cpu_model" in prov and "blas" in prov
    assert prov["cpu_model"] == host_facts.cpu_model()
    assert prov["blas"] is None or all(isinstance(k, str) for k in prov["blas"])
    canonical(prov)  # JSON-able as evidence needs it


def test_blas_probe_survives_broken_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy
    import torch

    def broken(*_a: object, **_k: object) -> object:
        raise RuntimeError("planted")

    monkeypatch.setattr(numpy, "show_config", broken)
    monkeypatch.setattr(torch.__config__, "show", broken)
    facts = host_facts.blas_facts()
    assert facts is None or ("numpy_blas" not in facts and "torch_blas_info" not in facts)
    assert json.dumps(facts) is not None
