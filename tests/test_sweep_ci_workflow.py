"""The example CI workflow (.github/workflows/sweep-sharded.yml) works: its own scripts, run here.

Issue 9: document sharding a sweep across hosts as a CI matrix (`--shard K/N` per job, then `merge`) with a
working example workflow file. The shard and merge steps' scripts are run as GitHub would (bash -eo
pipefail), with the artifacts of every shard job landing in one out/ as download-artifact does, and the
fake cells standing in for the real harness.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gradsweep.evidence.trust import ad_hoc_signers
from gradsweep.evidence.verify import check_signature
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest

WORKFLOW = REPO / ".github" / "workflows" / "sweep-sharded.yml"


def _step(job: dict, name: str) -> str:
    return next(s["run"] for s in job["steps"] if s.get("name") == name)


@pytest.fixture(scope="module")
def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def test_matrix_covers_every_shard(workflow: dict) -> None:
    shards = int(workflow["env"]["SHARDS"])
    assert workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"] == list(range(1, shards + 1))
    assert workflow["jobs"]["merge"]["needs"] == "shard"


def test_workflow_scripts_shard_and_merge(workflow: dict, tmp_path: Path) -> None:
    work = tmp_path / "checkout"  # a snapshot: every shard must see the same source tree, as CI's clone does
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for sub in ("gradsweep", "csrc", "tests/fakes"):
        shutil.copytree(REPO / sub, work / sub, ignore=skip)
    shutil.copy(REPO / "tests" / "__init__.py", work / "tests" / "__init__.py")
    (work / ".venv" / "bin").mkdir(parents=True)
    cli = work / ".venv" / "bin" / "gradsweep"
    cli.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gradsweep.cli "$@"\n')
    cli.chmod(0o755)
    manifest = write_manifest(tmp_path, {"b/p2/y": "red"}, ops=("a", "b", "c"))
    summary = tmp_path / "summary.md"
    env = {**os.environ, "PYTHONPATH": str(work), "GRADSWEEP_CELL_FN": FAKE_CELL,
           "GRADSWEEP_MANIFEST_LOADER": FAKE_LOADER, "MANIFEST": str(manifest),
           "SHARDS": str(workflow["env"]["SHARDS"]), "RUNNER_TEMP": str(tmp_path / "runner"),
           "GITHUB_STEP_SUMMARY": str(summary), "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    (tmp_path / "runner").mkdir()
    bash = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]
    shard_script = _step(workflow["jobs"]["shard"], "Sweep one shard")
    for shard in workflow["jobs"]["shard"]["strategy"]["matrix"]["shard"]:
        done = subprocess.run([*bash, shard_script], cwd=work, env={**env, "SHARD": str(shard)},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (shard, done.stdout, done.stderr)
        assert f"shard {shard}/4 exit" in done.stdout
    merge_script = _step(workflow["jobs"]["merge"], "Merge, report, verdict")
    done = subprocess.run([*bash, merge_script], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, (done.stdout, done.stderr)  # the planted untracked red fails the merged sweep
    merged = work / "out" / "merged.evidence.json"
    pred, _ = check_signature(merged, ad_hoc_signers([tmp_path / "runner" / "merge.pub.pem"]))
    assert len(pred.cells) == 12 and pred.selection.shards == ["1/4", "2/4", "3/4", "4/4"]
    assert (work / "out" / "merged.test-result.json").is_file() and (work / "out" / "junit.xml").is_file()
    assert "## gradsweep: tiny" in summary.read_text()
