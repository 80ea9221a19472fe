"""The shipped manifests' cells and each cell's candidate, against a snapshot; and how a profile's candidates
follow from its family (manifest_version 2) or are listed one by one (version 1).

The snapshot (tests/snapshots/manifest_cells.json) was taken from the version-1 manifests, which listed every
candidate; the version-2 files list only exceptions and must enumerate exactly the same cells with exactly
the same declarations. A deliberate change of a manifest's cells updates the snapshot in the same change.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from gradsweep import families
from gradsweep.manifest import MANIFEST_DIR, ManifestError, load_manifest
from gradsweep.ops.base import kernel_candidates
from tests.helpers import write_manifest

SNAPSHOT = Path(__file__).resolve().parent / "snapshots" / "manifest_cells.json"


def enumerate_cells(name: str) -> dict:
    """profile -> op -> {candidate declaration, layouts in cell order}, for a shipped manifest."""
    m = load_manifest(MANIFEST_DIR / f"{name}.yaml")
    out: dict = {}
    for key in m.cells():
        d = m.profiles[key.profile].candidates.get(key.op)
        decl = None if d is None else {"impl": d.impl, "status": d.status.value, "reason": d.reason,
                                       "tracking": d.tracking}
        entry = out.setdefault(key.profile, {}).setdefault(key.op, {"candidate": decl, "layouts": []})
        assert entry["candidate"] == decl
        entry["layouts"].append(key.layout)
    return out


@pytest.mark.parametrize("name", ["default", "h200", "ci_smoke"])
def test_cells_and_candidates_match_the_snapshot(name: str) -> None:
    expected = json.loads(SNAPSHOT.read_text())[name]
    got = enumerate_cells(name)
    assert list(got) == list(expected)  # profile order
    for prof in expected:
        assert list(got[prof]) == list(expected[prof]), prof  # op order
        for op in expected[prof]:
            assert got[prof][op] == expected[prof][op], f"{name}: {prof}/{op}"


def _v2(**profiles) -> dict:
    return {"manifest_version": 2, "name": "v2", "contract": str(MANIFEST_DIR / "contract.yaml"),
            "samples": {"lengths": [3, 2]}, "layouts": {"bn_full": {}, "b1_singleton": {}},
            "ops": {"rms_norm": {}, "attention": {}, "rl_ratio": {}}, "profiles": profiles}


def test_a_version_2_profile_runs_its_family_for_every_op_it_does_not_list(tmp_path) -> None:
    m = load_manifest(write_manifest(tmp_path, _v2(
        t={"family": "triton"},
        s={"family": "torch", "candidates": {"attention": {"status": "skipped", "reason": "not here"}}})))
    assert {op: d.impl for op, d in m.profiles["t"].candidates.items()} == {
        "rms_norm": "triton.rms_norm", "attention": "triton.attention", "rl_ratio": "triton.rl_ratio"}
    assert all(d.status.value == "required" for d in m.profiles["t"].candidates.values())
    s = m.profiles["s"].candidates
    assert s["attention"].status.value == "skipped" and s["rms_norm"].impl == "torch.rms_norm"


def test_a_version_2_profile_without_its_family_kernel_must_declare_the_exception(tmp_path) -> None:
    ops = {"rms_norm": {}, "pack": {}}
    data = _v2(c={"family": "cuda"})
    data["ops"] = ops
    data["ops"]["planted_rowsum"] = {"shape": {"features": 8}}
    data["plugins"] = ["tests.planted_ops"]
    with pytest.raises(ManifestError) as info:
        load_manifest(write_manifest(tmp_path, data), allow_plugins=True)
    msg = str(info.value)
    assert "profiles.c.candidates.planted_rowsum" in msg and "'cuda.planted_rowsum'" in msg
    assert "missing_required" in msg and "\n" not in msg
    data["profiles"]["c"]["candidates"] = {"planted_rowsum": {"status": "missing_required", "reason": "none yet"}}
    m = load_manifest(write_manifest(tmp_path, data), allow_plugins=True)
    assert m.profiles["c"].candidates["planted_rowsum"].status.value == "missing_required"
    assert m.profiles["c"].candidates["pack"].impl == "cuda.pack"


def test_a_version_1_profile_still_lists_every_candidate(tmp_path) -> None:
    data = _v2(t={"family": "triton", "candidates": {"rms_norm": {"impl": "triton.rms_norm"}}})
    data["manifest_version"] = 1
    m = load_manifest(write_manifest(tmp_path, data))
    assert set(m.profiles["t"].candidates) == {"rms_norm"}  # the others stay undeclared: blocked_c2


def test_an_unknown_manifest_version_is_refused_in_one_line(tmp_path) -> None:
    data = copy.deepcopy(_v2(t={"family": "triton"}))
    data["manifest_version"] = 3
    with pytest.raises(ManifestError, match=r"'manifest_version': 3 is not supported; this gradsweep reads "
                                            r"versions 1, 2"):
        load_manifest(write_manifest(tmp_path, data))


def test_kernel_candidates_follow_the_kernel_modules_on_disk(tmp_path, monkeypatch) -> None:
    """``<family>.<op>`` exists exactly for the families whose package holds the op's module; nothing imported."""
    def run(mod, ctx):
        raise AssertionError("never run here")

    assert set(kernel_candidates("x", "rms_norm", run)) == {"triton.x", "cuda.x"}
    assert kernel_candidates("x", "no_such_module", run) == {}
    (tmp_path / "triton_kernels").mkdir()
    (tmp_path / "triton_kernels" / "only_triton.py").write_text("raise ImportError('never imported')\n")
    monkeypatch.setattr(families, "_ROOT", tmp_path)
    cands = kernel_candidates("x", "only_triton", run, fold_params=("W",))
    assert list(cands) == ["triton.x"] and cands["triton.x"].family == "triton"
    assert cands["triton.x"].param_grads == "fold"


def test_shipped_manifests_are_version_2_and_list_only_exceptions() -> None:
    for name in ("default", "h200", "ci_smoke"):
        data = yaml.safe_load((MANIFEST_DIR / f"{name}.yaml").read_text())
        assert data["manifest_version"] == 2
        for prof in data["profiles"].values():
            for op, decl in (prof.get("candidates") or {}).items():
                assert decl.get("impl") != f"{prof['family']}.{op}", f"{name}: {op} repeats its family default"
