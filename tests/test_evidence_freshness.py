"""Freshness covers every input of a verdict; non-default cell code is flagged.

Issue 9: editing manifests/contract.yaml (k: 1000), tracked_reds.yaml, or appending bytes to the built
_C*.so -> `verify` still says "fresh"; evidence from a hidden --cell-fn verifies as PASS with no warning.
"""

from __future__ import annotations

import shutil
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence.freshness import NOT_RECORDED, check_inputs, stale_checks
from gradsweep.evidence.signing import write_keypair
from gradsweep.evidence.verify import read_evidence
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One real cell of manifests/ci_smoke.yaml, digested against a copy of the checkout (with a stand-in
    built extension and compiled fold planner, so the test depends on neither compiler)."""
    base = tmp_path_factory.mktemp("fresh")
    tree = base / "tree"
    for sub in ("gradsweep", "csrc", "manifests"):
        shutil.copytree(REPO / sub, tree / sub, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (tree / "gradsweep" / f"_C{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF stand-in extension")
    (tree / "gradsweep" / f"_fold_plan{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF stand-in planner")
    key = base / "k.pem"
    write_keypair(key)
    out = base / "ev.json"
    result = CliRunner().invoke(app, ["sweep", str(tree / "manifests" / "ci_smoke.yaml"), "--op", "rms_norm",
                                      "--profile", "torch_bf16", "--layout", "bn_full", "-o", str(out),
                                      "--key", str(key), "--tree", str(tree), "--no-progress"])
    assert result.exit_code in (0, 1), result.stderr
    return {"base": base, "tree": tree, "evidence": out, "pub": base / "k.pub.pem"}


def _verify(run: dict[str, Path], tree: Path, *extra: str):
    return CliRunner().invoke(app, ["verify", str(run["evidence"]), "--trusted-key", str(run["pub"]),
                                    "--tree", str(tree), *extra])


def _copy(run: dict[str, Path], tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(run["tree"], tree)
    return tree


def test_evidence_records_every_input_relatively(real_run: dict[str, Path]) -> None:
    pred = read_evidence(real_run["evidence"])
    assert pred.manifest.path == "manifests/ci_smoke.yaml"
    assert pred.contract.path == "manifests/contract.yaml" and pred.contract.sha256
    assert pred.tracked_file == "manifests/tracked_reds.yaml" and pred.tracked_sha256
    assert pred.extension is not None and pred.extension.path.startswith("gradsweep/_C")
    assert pred.planner is not None and pred.planner.path.startswith("gradsweep/_fold_plan")
    fresh = _verify(real_run, real_run["tree"])
    assert fresh.exit_code == 0, fresh.stderr
    assert "fresh: every input of the verdicts matches this checkout" in fresh.stdout


@pytest.mark.parametrize(("what", "edit", "line"), [
    ("contract", lambda t: (t / "manifests" / "contract.yaml").write_text(
        (t / "manifests" / "contract.yaml").read_text().replace("k: 2.0", "k: 1000", 1)), "contract differs"),
    ("tracked reds", lambda t: (t / "manifests" / "tracked_reds.yaml").write_text(
        (t / "manifests" / "tracked_reds.yaml").read_text() + "\n# edited\n"), "tracked reds differs"),
    ("manifest", lambda t: (t / "manifests" / "ci_smoke.yaml").write_text(
        (t / "manifests" / "ci_smoke.yaml").read_text().replace("seed: 5", "seed: 6")), "manifest differs"),
    ("manifest gone", lambda t: (t / "manifests" / "ci_smoke.yaml").unlink(), "manifest missing"),
    ("source", lambda t: (t / "gradsweep" / "cli.py").write_text("# edited\n"), "source tree differs"),
])
def test_a_changed_input_makes_the_evidence_stale(real_run: dict[str, Path], tmp_path: Path, what: str,
                                                   edit, line: str) -> None:
    tree = _copy(real_run, tmp_path)
    edit(tree)
    result = _verify(real_run, tree)
    assert result.exit_code == 4, (what, result.stdout, result.stderr)
    assert result.stderr.startswith("STALE: ") and line in result.stderr
    assert _verify(real_run, tree, "--allow-stale").exit_code == 0


def test_extension_is_compared_only_when_built_here(real_run: dict[str, Path], tmp_path: Path) -> None:
    tree = _copy(real_run, tmp_path)
    ext = next((tree / "gradsweep").glob("_C*"))
    with open(ext, "ab") as fh:
        fh.write(b"\0appended")
    edited = _verify(real_run, tree)
    assert edited.exit_code == 4 and "extension differs" in edited.stderr
    assert "--allow-other-build" in edited.stderr
    assert _verify(real_run, tree, "--allow-other-build").exit_code == 0
    (tree / "manifests" / "contract.yaml").write_text("contract_version: x\n")
    both = _verify(real_run, tree, "--allow-other-build")
    assert both.exit_code == 4 and "contract differs" in both.stderr and "extension" not in both.stderr
    ext.unlink()
    (tree / "manifests" / "contract.yaml").write_bytes((real_run["tree"] / "manifests" / "contract.yaml").read_bytes())
    unbuilt = _verify(real_run, tree)
    assert unbuilt.exit_code == 0, unbuilt.stderr
    assert "extension not compared: not built in this checkout" in unbuilt.stdout


def test_the_fold_planner_is_compared_only_when_built_here(real_run: dict[str, Path], tmp_path: Path) -> None:
    """The compiled fold planner plans every canonical fold of the run: a rebuilt or edited one is stale, accepted
    (like the extension) by --allow-other-build only; none built here is not compared."""
    tree = _copy(real_run, tmp_path)
    plan = next((tree / "gradsweep").glob("_fold_plan*"))
    with open(plan, "ab") as fh:
        fh.write(b"\0appended")
    edited = _verify(real_run, tree)
    assert edited.exit_code == 4 and "fold planner differs" in edited.stderr, edited.stderr
    assert "extension" not in edited.stderr and "--allow-other-build accepts the builds only" in edited.stderr
    assert _verify(real_run, tree, "--allow-other-build").exit_code == 0
    plan.unlink()
    unbuilt = _verify(real_run, tree)
    assert unbuilt.exit_code == 0, unbuilt.stderr
    assert "fold planner not compared: not built in this checkout" in unbuilt.stdout


def test_evidence_format_1_is_stale(real_run: dict[str, Path]) -> None:
    pred = read_evidence(real_run["evidence"]).model_copy(update={"schema_version": 1})
    checks = {c.name: c for c in check_inputs(pred, real_run["tree"])}
    assert {checks[n].state for n in ("contract", "tracked reds", "extension")} == {NOT_RECORDED}
    assert {c.name for c in stale_checks(list(checks.values()))} == {"contract", "tracked reds", "extension"}


def test_non_default_cell_function_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    key = tmp_path / "k.pem"
    write_keypair(key)
    out = tmp_path / "ev.json"
    swept = CliRunner().invoke(app, ["sweep", str(write_manifest(tmp_path)), "-o", str(out), "--key", str(key),
                                     "--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER, "--no-progress"])
    assert swept.exit_code == 0, swept.stderr
    trust = ["--trusted-key", str(tmp_path / "k.pub.pem")]
    verified = CliRunner().invoke(app, ["verify", str(out), "--allow-stale", *trust])
    assert verified.exit_code == 0
    assert "WARNING: NON-DEFAULT CELL FUNCTION tests.fakes.cells:cell" in verified.stderr
    assert "WARNING: NON-DEFAULT MANIFEST LOADER tests.fakes.manifest:load_manifest" in verified.stderr
    for fmt in ("table", "md", "junit"):
        shown = CliRunner().invoke(app, ["report", str(out), "-f", fmt, *trust])
        assert shown.exit_code == 0 and "NON-DEFAULT CELL FUNCTION" in shown.stdout, fmt
