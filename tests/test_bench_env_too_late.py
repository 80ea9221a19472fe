"""A bench whose profile sets a Triton switch Triton has already read (torch imports Triton, so any switch set
after the process started is too late): refused before anything is set, and the command line re-runs itself
once in a fresh process with the switch set from its start.

Before this, ``gradsweep bench --quick`` on a CPU box without ``TRITON_INTERPRET=1`` in the shell recorded every
Triton row as an error ("Cannot call @triton.jit'd outside of the scope of a kernel") and exited 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from gradsweep.bench.evidence import read_bench
from gradsweep.bench.suite import EnvTooLate, apply_env
from gradsweep.evidence.signing import write_keypair
from gradsweep.manifest import MANIFEST_DIR

SMOKE = str(MANIFEST_DIR / "ci_smoke.yaml")


def test_a_triton_switch_after_triton_was_imported_is_refused_and_nothing_is_set(monkeypatch):
    import triton  # noqa: F401  (what torch does on its own import)

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("GRADSWEEP_PROBE_SWITCH", raising=False)
    with pytest.raises(EnvTooLate, match=r"TRITON_INTERPRET=1 gradsweep bench") as caught:
        apply_env({"GRADSWEEP_PROBE_SWITCH": "x", "TRITON_INTERPRET": "1"})
    assert caught.value.env == {"GRADSWEEP_PROBE_SWITCH": "x", "TRITON_INTERPRET": "1"}
    assert "TRITON_INTERPRET" not in os.environ and "GRADSWEEP_PROBE_SWITCH" not in os.environ


def test_a_switch_already_in_effect_and_other_variables_are_applied(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.delenv("GRADSWEEP_PROBE_SWITCH", raising=False)
    apply_env({"TRITON_INTERPRET": "1", "GRADSWEEP_PROBE_SWITCH": "x"})
    assert os.environ["GRADSWEEP_PROBE_SWITCH"] == "x"


def _cli(tmp_path, *extra_env: tuple[str, str]) -> tuple[subprocess.CompletedProcess, object]:
    key = tmp_path / "keys" / "k.pem"
    write_keypair(key)
    out = tmp_path / "smoke.bench.evidence.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(dict(extra_env))
    run = subprocess.run([sys.executable, "-m", "gradsweep.cli", "bench", SMOKE, "--quick", "--op", "silu", "-o",
                          str(out), "--key", str(key), "--chart", str(tmp_path / "c.png")],
                         env=env, capture_output=True, text=True, timeout=600)
    return run, out


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU bench: its Triton profile is the interpreter's")
def test_the_command_line_reruns_itself_with_the_switch_and_the_triton_rows_run(tmp_path):
    run, out = _cli(tmp_path)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text
    assert "re-running in a fresh process with TRITON_INTERPRET=1" in text
    pred = read_bench(out)
    assert pred.runs[0].interpreter is True
    assert pred.summary.errors == 0
    triton_rows = [f for c in pred.cases for name, f in c.families.items() if name == "triton"]
    assert triton_rows and all(f.status != "error" for f in triton_rows)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU bench: its Triton profile is the interpreter's")
def test_a_rerun_that_meets_the_refusal_again_fails_with_the_fix(tmp_path):
    run, out = _cli(tmp_path, ("GRADSWEEP_BENCH_RERUN", "1"))
    assert run.returncode == 2, run.stdout + run.stderr
    assert "TRITON_INTERPRET=1 gradsweep bench" in run.stderr
    assert not out.exists()
