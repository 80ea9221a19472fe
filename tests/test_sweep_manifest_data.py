"""Manifests are data: profile env is allowlisted, plugins need --allow-plugins, shapes must fit, reruns.

Issue 9: a profile's `env: {PYTHONPATH: ...}` makes a planted sitecustomize.py run in the workers that
hold the signing key; `plugins:` are imported even by `list --manifest`; `hidden: 1000000000` is accepted
and every cell then tries a 52 GB allocation.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.errors import BadInput
from gradsweep.evidence.signing import write_keypair
from gradsweep.evidence.verify import read_evidence
from gradsweep.manifest import DEFAULT_MANIFEST, MANIFEST_DIR, Manifest, ManifestError, load_manifest
from gradsweep.ops.registry import all_ops
from gradsweep.results import CellKey
from gradsweep.sweep.memory import GPU, HOST, SAFETY, check_memory, estimate_op
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest
from tests.helpers import planted_manifest_dict
from tests.helpers import write_manifest as write_real_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]
BASE = yaml.safe_load(DEFAULT_MANIFEST.read_text())
BASE["contract"] = str(MANIFEST_DIR / "contract.yaml")


def _default_with(mutate) -> dict:
    data = copy.deepcopy(BASE)
    mutate(data)
    return data


@pytest.fixture
def key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    write_keypair(tmp_path / "k.pem")
    return tmp_path / "k.pem"


# --- profile env ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["PYTHONPATH", "LD_PRELOAD", "PYTHONSTARTUP", "TRITON_CACHE_DIR",
                                  "TRITON_PTXAS_PATH", "CUDA_HOME", "GRADSWEEP_CELL_FN", "HOME"])
def test_profile_env_outside_the_allowlist_is_refused(tmp_path: Path, name: str) -> None:
    data = _default_with(lambda d: d["profiles"]["torch_bf16"].__setitem__("env", {name: str(tmp_path)}))
    with pytest.raises(ManifestError) as info:
        load_manifest(write_real_manifest(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message and "profiles.torch_bf16.env" in message and name in message


def test_allowlisted_profile_env_loads(tmp_path: Path) -> None:
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "0", "GRADSWEEP_X": "y",
           "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    data = _default_with(lambda d: d["profiles"]["torch_bf16"].__setitem__("env", env))
    assert load_manifest(write_real_manifest(tmp_path, data)).profiles["torch_bf16"].env == env


def _planted_site(directory: Path, marker: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('ran\\n')\n")
    return directory


def test_planted_sitecustomize_never_runs_in_workers(tmp_path: Path, key: Path) -> None:
    marker = tmp_path / "PWNED"
    evil = _planted_site(tmp_path / "evil", marker)
    manifest = write_manifest(tmp_path, name="evil", profiles=("p1",), ops=("a",), layouts=("x",))
    data = yaml.safe_load(manifest.read_text())
    data["profiles"]["p1"]["env"]["PYTHONPATH"] = str(evil)
    manifest.write_text(yaml.safe_dump(data))
    refused = CliRunner().invoke(app, ["sweep", str(manifest), "-o", str(tmp_path / "e.json"), "--key", str(key),
                                       "--no-progress", *FAKES])
    assert refused.exit_code == 2 and "PYTHONPATH" in refused.stderr
    checked = CliRunner().invoke(app, ["check", "--op", "a", "--profile", "p1", "--layout", "x", "--manifest",
                                       str(manifest), *FAKES])
    assert checked.exit_code == 2 and os.environ.get("PYTHONPATH") != str(evil)
    # a sitecustomize.py in the directory the sweep runs from is not on a worker's path either
    here = _planted_site(tmp_path / "cwd", marker)
    clean = write_manifest(tmp_path, name="clean", profiles=("p1",), ops=("a",), layouts=("x",))
    done = subprocess.run([sys.executable, "-m", "gradsweep.cli", "sweep", str(clean), "-o", "e.json", "--key",
                           str(key), "--no-progress", *FAKES], cwd=here, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), "a planted sitecustomize.py ran"


# --- plugins -------------------------------------------------------------------------------------------

def _planted_manifest(tmp_path: Path) -> Path:
    data = planted_manifest_dict("torch.splitk")
    data["ops"]["planted_rowsum"]["shape"]["features"] = 16  # small: this is about loading, not verdicts
    return write_real_manifest(tmp_path, data)


def test_plugins_are_not_imported_without_the_flag(tmp_path: Path, key: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "IMPORTED"
    module = f"sneaky_plugin_{os.getpid()}"  # unique: no other test can have imported it
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / f"{module}.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "plug"))
    data = planted_manifest_dict("torch.splitk")
    data["plugins"] = [module]
    manifest = write_real_manifest(tmp_path, data)
    for args in (["list", "ops", "--manifest", str(manifest)],
                 ["check", "--op", "planted_rowsum", "--profile", "planted", "--layout", "bn_full", "--manifest",
                  str(manifest)],
                 ["sweep", str(manifest), "-o", str(tmp_path / "e.json"), "--key", str(key), "--no-progress"],
                 ["drift", "--manifest", str(manifest), "--profile", "planted"]):
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 2, (args, done.stderr)
        assert "--allow-plugins" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert not marker.exists() and module not in sys.modules, f"{args[0]} imported a plugin"


def test_plugins_load_with_the_flag(tmp_path: Path, key: Path) -> None:
    manifest = _planted_manifest(tmp_path)
    listed = CliRunner().invoke(app, ["list", "ops", "--manifest", str(manifest), "--allow-plugins"])
    assert listed.exit_code == 0 and listed.stdout.split() == ["planted_rowsum"]
    checked = CliRunner().invoke(app, ["check", "--op", "planted_rowsum", "--profile", "planted", "--layout",
                                       "bn_full", "--manifest", str(manifest), "--allow-plugins", "--json"])
    assert checked.exit_code in (0, 1), checked.stderr
    out = tmp_path / "e.json"
    swept = CliRunner().invoke(app, ["sweep", str(manifest), "--layout", "bn_full", "-o", str(out), "--key",
                                     str(key), "--allow-plugins", "--no-progress"])
    assert swept.exit_code in (0, 1), swept.stderr
    pred = read_evidence(out)
    assert pred.runs[0].plugins == ["tests.planted_ops"]
    assert pred.cells[0].result.status.value != "error", pred.cells[0].result.reason
    verified = CliRunner().invoke(app, ["verify", str(out), "--allow-stale", "--trusted-key",
                                        str(tmp_path / "k.pub.pem")])
    assert "WARNING: PLUGINS imported (--allow-plugins): tests.planted_ops" in verified.stderr


def test_library_loads_plugins_only_when_asked(tmp_path: Path) -> None:
    manifest = _planted_manifest(tmp_path)
    with pytest.raises(ManifestError, match="pass --allow-plugins"):
        load_manifest(manifest)
    assert isinstance(load_manifest(manifest, allow_plugins=True), Manifest)


# --- memory --------------------------------------------------------------------------------------------

def test_huge_shape_is_refused_before_any_cell_runs(tmp_path: Path, key: Path) -> None:
    data = _default_with(lambda d: d["ops"]["rms_norm"]["shape"].__setitem__("hidden", 1_000_000_000))
    manifest = write_real_manifest(tmp_path, data)
    out = tmp_path / "e.json"
    started = time.monotonic()
    result = CliRunner().invoke(app, ["sweep", str(manifest), "-o", str(out), "--key", str(key), "--no-progress"])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    line = result.stderr.strip()
    assert line.startswith("gradsweep: error: ops.rms_norm.shape.hidden: rms_norm needs at least ")
    assert "\n" not in line and "reduce hidden" in line
    assert time.monotonic() - started < 60 and not out.exists() and not Path(f"{out}.partial.jsonl").exists()
    checked = CliRunner().invoke(app, ["check", "--op", "rms_norm", "--profile", "torch_bf16", "--layout",
                                       "bn_full", "--manifest", str(manifest)])
    assert checked.exit_code == 2 and "ops.rms_norm.shape.hidden" in checked.stderr


def test_memory_estimate_is_generic_and_device_aware(tmp_path: Path) -> None:
    shapes = {name: op.shape_model().model_dump(exclude_none=True) for name, op in all_ops().items()}
    for name, shape in shapes.items():
        est = estimate_op(name, shape, tokens=10)
        assert est.bytes > 0 and est.bytes % (8 * SAFETY) == 0, name
    manifest = load_manifest(DEFAULT_MANIFEST)
    cells = [CellKey(op="lm_head", profile=p, layout="bn_full")
             for p in ("torch_bf16", "triton_interpret", "triton_cuda_bf16")]
    need = estimate_op("lm_head", manifest.shape("lm_head"), sum(manifest.samples.lengths)).bytes
    asked: list[str] = []

    def free(kind: str) -> int:
        asked.append(kind)
        return need - 1 if kind == GPU else need * 10

    with pytest.raises(BadInput, match=r"^ops\.lm_head\.shape\.vocab: .* the GPU has"):
        check_memory(manifest, cells, gpus_visible=True, free=free)
    asked.clear()
    check_memory(manifest, cells, gpus_visible=False, free=free)  # cuda profiles blocked; auto/cpu on host
    assert asked == [HOST]


# --- reruns --------------------------------------------------------------------------------------------

def test_reruns_field_and_override_reach_the_workers(tmp_path: Path, key: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_manifest(DEFAULT_MANIFEST).reruns == 1
    with pytest.raises(ManifestError, match="reruns"):
        load_manifest(write_real_manifest(tmp_path, _default_with(lambda d: d.__setitem__("reruns", 0))))
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_CALL_LOG", str(log))
    monkeypatch.setenv("FAKE_CALL_DETAIL", "1")
    manifest = write_manifest(tmp_path, reruns=2)
    for flag, expect in (([], 2), (["--reruns", "3"], 3)):
        log.unlink(missing_ok=True)
        out = tmp_path / f"e{expect}.json"
        result = CliRunner().invoke(app, ["sweep", str(manifest), "-o", str(out), "--key", str(key),
                                          "--no-progress", *flag, *FAKES])
        assert result.exit_code == 0, result.stderr
        assert {line.split("reruns=")[1] for line in log.read_text().splitlines()} == {str(expect)}
        assert read_evidence(out).selection.reruns == expect
    log.unlink()
    checked = CliRunner().invoke(app, ["check", "--op", "a", "--profile", "p1", "--layout", "x", "--manifest",
                                       str(manifest), "--reruns", "5", *FAKES])
    assert checked.exit_code == 0 and log.read_text().strip().endswith("reruns=5")
    bad = CliRunner().invoke(app, ["sweep", str(manifest), "--reruns", "0", "--no-progress", *FAKES])
    assert bad.exit_code == 2 and "--reruns 0" in bad.stderr
