"""An interrupted sweep keeps its finished cells and --resume does not run them again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradsweep.errors import BadInput
from gradsweep.evidence.provenance import Provenance, collect_provenance
from gradsweep.evidence.signing import write_keypair
from gradsweep.results import CellResult
from gradsweep.sweep.api import SweepOptions, execute_sweep, prepare_sweep
from gradsweep.sweep.partial import partial_path
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest


def _calls(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def _interrupt_after(n: int, opts: SweepOptions, prov: Provenance) -> list[CellResult]:
    """Run the sweep and stop it with a KeyboardInterrupt once n cells finished (a Ctrl-C mid-sweep); those cells."""
    seen: list[CellResult] = []

    def interrupt(result: CellResult) -> None:
        seen.append(result)
        if len(seen) == n:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute_sweep(prepare_sweep(opts, lambda _m: None), on_result=interrupt, provenance=prov)
    return seen


def test_resume_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_CALL_LOG", str(log))
    key = tmp_path / "k.pem"
    write_keypair(key)
    manifest = write_manifest(tmp_path, {"b/p2/y": "red"}, ops=("a", "b", "c"))
    out = tmp_path / "ev.json"
    opts = SweepOptions(manifest=manifest, out=out, key=key, cell_fn=FAKE_CELL, loader=FAKE_LOADER, jobs=1)
    prov = collect_provenance(REPO)
    seen = _interrupt_after(5, opts, prov)
    assert not out.exists()
    lines = partial_path(out).read_text().splitlines()
    assert len(lines) == 1 + 5 and "header" in json.loads(lines[0])
    first_calls = _calls(log)
    finished = {r.key.id for r in seen}

    said: list[str] = []
    opts.resume = True
    plan = prepare_sweep(opts, said.append)
    assert len(plan.kept) == 5 and len(plan.remaining) == 12 - 5
    assert any("5 of 12 cells already done" in s for s in said)
    outcome = execute_sweep(plan, provenance=prov)
    calls = _calls(log)
    assert all(calls.count(cid) == 1 for cid in finished), "a finished cell was run again"
    assert len(calls) - len(first_calls) == 7
    assert len(outcome.predicate.cells) == 12 and outcome.predicate.runs[0].resumed_cells == 5
    assert out.is_file() and not partial_path(out).exists()
    assert outcome.exit_code == 1  # the planted untracked red


def test_resume_refuses_another_runs_partial(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    write_keypair(key)
    out = tmp_path / "ev.json"
    partial_path(out).write_text(json.dumps({"header": {"manifest_sha256": "0" * 64}}) + "\n")
    opts = SweepOptions(manifest=write_manifest(tmp_path), out=out, key=key, cell_fn=FAKE_CELL,
                        loader=FAKE_LOADER, resume=True)
    with pytest.raises(BadInput, match="different run"):
        prepare_sweep(opts, lambda _m: None)


def test_resume_refuses_a_partial_run_on_other_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The partial log records the cards its cells ran on: a resume on another kind of card is another run (its
    evidence would name one device for cells measured on two)."""
    from gradsweep.sweep import api

    key = tmp_path / "k.pem"
    write_keypair(key)
    out = tmp_path / "ev.json"
    opts = SweepOptions(manifest=write_manifest(tmp_path, ops=("a", "b", "c")), out=out, key=key, cell_fn=FAKE_CELL,
                        loader=FAKE_LOADER, jobs=1)
    monkeypatch.setattr(api, "gpu_names", lambda _gpus: ["NVIDIA H100 80GB HBM3"])
    assert len(_interrupt_after(2, opts, collect_provenance(REPO))) == 2
    assert json.loads(partial_path(out).read_text().splitlines()[0])["header"]["gpus"] == ["NVIDIA H100 80GB HBM3"]
    opts.resume = True
    monkeypatch.setattr(api, "gpu_names", lambda _gpus: ["NVIDIA H200"])
    with pytest.raises(BadInput, match=r"different run \(gpus differ\)"):
        prepare_sweep(opts, lambda _m: None)
    monkeypatch.setattr(api, "gpu_names", lambda _gpus: ["NVIDIA H100 80GB HBM3"])
    assert len(prepare_sweep(opts, lambda _m: None).kept) == 2  # the same cards: it resumes


def test_gpu_names_asks_nvidia_smi_by_index(monkeypatch: pytest.MonkeyPatch) -> None:
    from gradsweep.evidence import provenance

    monkeypatch.setattr(provenance, "_run", lambda cmd, cwd=None: "0, NVIDIA H200\n1, NVIDIA H100 80GB HBM3")
    assert provenance.gpu_names([1, 0]) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert provenance.gpu_names([]) == []
    monkeypatch.setattr(provenance, "_run", lambda cmd, cwd=None: None)
    assert provenance.gpu_names([0]) is None


def test_interrupted_cli_sweep_resumes(tmp_path: Path) -> None:
    """A real Ctrl-C (SIGINT) to `gradsweep sweep`, then `--resume`: finished cells run once. The sweep starts with
    SIGINT at its default disposition whatever this process inherited: a shell's background job ignores SIGINT,
    the ignore is inherited across exec, and Python then installs no KeyboardInterrupt handler (a `.ci/run` started
    with `&` from a script ran all 12 cells through the signal and exited 0)."""
    log = tmp_path / "calls.log"
    key = tmp_path / "k.pem"
    write_keypair(key)
    manifest = write_manifest(tmp_path, ops=("a", "b", "c"))
    out = tmp_path / "ev.json"
    env = {**os.environ, "FAKE_CALL_LOG": str(log), "FAKE_SLEEP": "0.2", "GRADSWEEP_CELL_FN": FAKE_CELL,
           "GRADSWEEP_MANIFEST_LOADER": FAKE_LOADER, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "gradsweep.cli", "sweep", str(manifest), "-o", str(out), "--key", str(key),
           "-j", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        part = partial_path(out)
        if part.exists() and len(part.read_text().splitlines()) >= 1 + 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"--resume" in err
    done = [json.loads(x)["result"]["key"] for x in partial_path(out).read_text().splitlines()[1:]]
    done_ids = {f"{k['op']}/{k['profile']}/{k['layout']}" for k in done}
    assert 3 <= len(done_ids) < 12
    again = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, cwd=tmp_path, timeout=120)
    assert again.returncode == 0, again.stderr.decode()
    assert f"{len(done_ids)} of 12 cells already done".encode() in again.stderr
    calls = _calls(log)
    assert all(calls.count(cid) == 1 for cid in done_ids)
    assert set(calls) == {f"{o}/{p}/{lay}" for o in "abc" for p in ("p1", "p2") for lay in "xy"}
    assert out.is_file() and not partial_path(out).exists()
