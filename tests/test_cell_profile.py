"""scripts/cell_profile.py (where a sweep cell's time goes, run on the GPU next): run on CPU cells of the default
manifest, it must give each cell the verdict the sweep's own cell function gives, time the harness's phases inside
the cell's wall time, and share the op's baselines across its cells as a worker does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gradsweep.harness.cell import run_cell
from gradsweep.manifest import load_manifest
from gradsweep.results import CellKey

REPO = Path(__file__).resolve().parents[1]
CELLS = ["rms_norm/torch_bf16/bn_full", "rms_norm/torch_bf16/bn_chunked", "det_gemm/torch_bf16/b1_singleton"]


def test_profiles_each_cell_with_its_sweep_verdict(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    res = subprocess.run([sys.executable, "scripts/cell_profile.py", "manifests/default.yaml", str(out), *CELLS],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = json.loads(out.read_text())["cells"]
    assert [r["cell"] for r in rows] == CELLS
    manifest = load_manifest(REPO / "manifests" / "default.yaml")
    for row in rows:
        op, profile, layout = row["cell"].split("/")
        expected = run_cell(manifest, CellKey(op=op, profile=profile, layout=layout)).status
        assert row["status"] == str(expected)
        phases = row["phases_s"]  # judge includes the baselines and the reference run it asks for
        assert 0 < phases["judge"] <= row["wall_s"] + 0.05
        assert phases.get("op_baselines", 0) + phases.get("reference_run", 0) <= phases["judge"] + 0.05
        assert "judge" in row["phases_s"] and row["top_cumulative"] and row["top_own"]
    assert "op_baselines" in rows[0]["phases_s"]  # the op's first cell computes its baselines
    assert "op_baselines" not in rows[1]["phases_s"]  # the same op's next cell takes them from the cache


def test_one_profile_per_run(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "scripts/cell_profile.py", "manifests/default.yaml", str(tmp_path / "x"),
                          "rms_norm/torch_bf16/bn_full", "rms_norm/triton_interpret/bn_full"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "one profile per run" in res.stderr
