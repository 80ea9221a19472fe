"""``gradsweep bench`` on a CPU box (what CI runs): the --quick smoke under the Triton interpreter with the real
clock, and the documented exit codes for a box without a GPU and for bad input."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml
from typer.testing import CliRunner

from gradsweep.bench.evidence import read_bench
from gradsweep.cli import app
from gradsweep.evidence.signing import write_keypair
from gradsweep.manifest import MANIFEST_DIR

SMOKE = str(MANIFEST_DIR / "ci_smoke.yaml")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU behaviour of bench")


@pytest.fixture()
def key(tmp_path):
    path = tmp_path / "keys" / "k.pem"
    write_keypair(path)
    return path


def _bench(*args: str):
    return CliRunner().invoke(app, ["bench", *args])


@NO_GPU
def test_quick_cpu_smoke_writes_verifiable_evidence_and_a_chart(tmp_path, key):
    out = tmp_path / "smoke.bench.evidence.json"
    chart = tmp_path / "chart.png"
    result = _bench(SMOKE, "--quick", "--op", "silu", "-o", str(out), "--key", str(key), "--chart", str(chart))
    assert result.exit_code == 0, result.output
    assert "SMOKE RUN" in result.output and "silu" in result.output
    pred = read_bench(out)
    assert not pred.claims_figures and pred.runs[0].device == "cpu" and pred.runs[0].interpreter
    fams = [f for c in pred.cases for f in c.families.values()]
    assert fams and all(f.status == "ok" for f in fams)
    assert all(c.passed for f in fams for c in f.checks) and any(c.kind == "contract" for f in fams for c in f.checks)
    if importlib.util.find_spec("matplotlib") is not None:
        assert chart.read_bytes()[:4] == b"\x89PNG" and pred.chart.file == "chart.png"
    else:  # the chart is skipped with a message, the evidence says why
        assert not chart.exists() and "matplotlib" in pred.chart.reason
    verified = CliRunner().invoke(app, ["verify", str(out), "--trusted-key", str(key.with_name("k.pub.pem"))])
    assert verified.exit_code == 0, verified.output


@NO_GPU
def test_without_a_gpu_a_full_bench_exits_3_in_one_line(tmp_path, key):
    result = _bench(SMOKE, "-o", str(tmp_path / "b.evidence.json"), "--key", str(key))
    assert result.exit_code == 3
    assert result.output.count("gradsweep: error:") == 1
    assert "no CUDA GPU" in result.output and "--quick" in result.output
    assert not (tmp_path / "b.evidence.json").exists()


def test_bad_input_exits_2_before_anything_runs(tmp_path, key):
    out = str(tmp_path / "b.evidence.json")
    unknown = _bench(SMOKE, "--quick", "--op", "softmaxx", "-o", out, "--key", str(key))
    assert unknown.exit_code == 2 and "--op softmaxx" in unknown.output and "rms_norm" in unknown.output
    family = _bench(SMOKE, "--quick", "--family", "metal", "-o", out, "--key", str(key))
    assert family.exit_code == 2 and "--family metal" in family.output
    targets = tmp_path / "t.yaml"
    targets.write_text(yaml.safe_dump({"version": 1, "targets": [{"op": "rms_norm", "case": "bwd", "metric": "speed",
                                                                  "max": 1.0, "issue": "13"}]}))
    bad = _bench(SMOKE, "--quick", "--targets", str(targets), "-o", out, "--key", str(key))
    assert bad.exit_code == 2 and "does not report 'speed'" in bad.output
    missing = _bench(str(tmp_path / "nope.yaml"), "--quick", "-o", out, "--key", str(key))
    assert missing.exit_code == 2 and "no such file" in missing.output
    (tmp_path / "notes.txt").write_text("mine")
    clobber = _bench(SMOKE, "--quick", "-o", str(tmp_path / "notes.txt"), "--key", str(key))
    assert clobber.exit_code == 2 and "--force" in clobber.output and (tmp_path / "notes.txt").read_text() == "mine"
    into_dir = _bench(SMOKE, "--quick", "-o", str(tmp_path), "--key", str(key))
    assert into_dir.exit_code == 2 and "is a directory" in into_dir.output
    onto_manifest = _bench(SMOKE, "--quick", "--chart", SMOKE, "-o", out, "--key", str(key))
    assert onto_manifest.exit_code == 2 and "manifest" in onto_manifest.output
    for result in (unknown, family, bad, missing, clobber, into_dir, onto_manifest):
        assert "Traceback" not in result.output
    assert not (tmp_path / "b.evidence.json").exists()
