"""Nothing is lost or overwritten by surprise; every error is one line; the CLI is consistent.

Issue 9: `sweep m.yaml -o m.yaml` overwrites the manifest; `--key k.pem -o k.pem` overwrites the private
key; `-o` silently replaces evidence of another manifest; a rerun without `--resume` silently discards a
partial log; tracebacks for `report E -o /nonexistent/x`, `report -o <dir>`, `check --candidate
triton.nope`; no `--version`; `--out` vs `--output`; `<bool>` metavars; `check` tables truncate when piped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence.signing import write_keypair
from gradsweep.manifest import DEFAULT_MANIFEST
from gradsweep.sweep.partial import partial_path
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, write_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    write_keypair(tmp_path / "k.pem")
    (tmp_path / "contract.yaml").write_text("contract_version: fake-1\n")
    (tmp_path / "tracked_reds.yaml").write_text("tracked: []\n")
    manifest = write_manifest(tmp_path, contract_file="contract.yaml")
    return {"dir": tmp_path, "manifest": manifest, "key": tmp_path / "k.pem"}


def _sweep(world: dict[str, Path], *args: str, manifest: Path | None = None):
    return CliRunner().invoke(app, ["sweep", str(manifest or world["manifest"]), "--key", str(world["key"]),
                                    "--no-progress", *args, *FAKES])


def _one_line(result, needle: str, code: int = 2) -> None:
    assert result.exit_code == code, (result.exception, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradsweep: error: "), result.stderr
    assert needle in lines[0], lines[0]


@pytest.mark.parametrize("target", ["manifest", "key", "key.pub", "contract", "tracked"])
def test_out_never_targets_an_input(world: dict[str, Path], target: str) -> None:
    path = {"manifest": world["manifest"], "key": world["key"], "key.pub": world["dir"] / "k.pub.pem",
            "contract": world["dir"] / "contract.yaml", "tracked": world["dir"] / "tracked_reds.yaml"}[target]
    before = path.read_bytes()
    result = _sweep(world, "-o", str(path))
    _one_line(result, "writing there would destroy it")
    assert path.read_bytes() == before


def test_partial_log_is_never_an_input(world: dict[str, Path]) -> None:
    out = world["dir"] / "tiny.yaml"  # its partial log would be tiny.yaml.partial.jsonl: harmless, but out is
    _one_line(_sweep(world, "-o", str(out)), "is the manifest")  # the manifest itself


def test_replacing_evidence_of_another_manifest_needs_force(world: dict[str, Path]) -> None:
    out = world["dir"] / "ev.json"
    other = write_manifest(world["dir"], name="other")
    assert _sweep(world, "-o", str(out), manifest=other).exit_code == 0
    before = out.read_bytes()
    _one_line(_sweep(world, "-o", str(out)), "holds evidence of manifest 'other'")
    assert out.read_bytes() == before
    assert _sweep(world, "-o", str(out), "--force").exit_code == 0
    assert _sweep(world, "-o", str(out)).exit_code == 0  # same manifest again: a rerun replaces it
    notes = world["dir"] / "notes.txt"
    notes.write_text("mine\n")
    _one_line(_sweep(world, "-o", str(notes)), "is not gradsweep evidence")
    assert notes.read_text() == "mine\n"


def test_a_partial_log_is_never_dropped_silently(world: dict[str, Path]) -> None:
    out = world["dir"] / "ev.json"
    log = partial_path(out)
    header = {"header": {"manifest_sha256": "0" * 64}}
    result = {"result": {"key": {"op": "a", "profile": "p1", "layout": "x"}, "status": "green"}}
    log.write_text(json.dumps(header) + "\n" + json.dumps(result) + "\n")
    before = log.read_bytes()
    _one_line(_sweep(world, "-o", str(out)), "holds 1 finished cell(s) of an interrupted run; pass --resume")
    assert log.read_bytes() == before and not out.exists()


def test_merge_out_never_targets_a_shard(world: dict[str, Path]) -> None:
    shards = []
    for k in (1, 2):
        shard = world["dir"] / f"s{k}.json"
        assert _sweep(world, "--shard", f"{k}/2", "-o", str(shard)).exit_code == 0
        shards.append(str(shard))
    before = Path(shards[0]).read_bytes()
    result = CliRunner().invoke(app, ["merge", *shards, "-o", shards[0], "--key", str(world["key"]),
                                      "--trusted-key", str(world["dir"] / "k.pub.pem")])
    _one_line(result, "writing there would destroy it")
    assert Path(shards[0]).read_bytes() == before


def test_report_output_errors_are_one_line(world: dict[str, Path]) -> None:
    out = world["dir"] / "ev.json"
    assert _sweep(world, "-o", str(out)).exit_code == 0
    trust = ["--trusted-key", str(world["dir"] / "k.pub.pem")]
    runner = CliRunner()
    _one_line(runner.invoke(app, ["report", str(out), "-o", "/nonexistent/x", *trust]), "does not exist")
    assert not Path("/nonexistent").exists()
    _one_line(runner.invoke(app, ["report", str(out), "-o", str(world["dir"]), *trust]), "is a directory")
    _one_line(runner.invoke(app, ["report", str(out), "-o", str(out), *trust]), "is the evidence")
    made = runner.invoke(app, ["report", str(out), "-f", "md", "-o", str(world["dir"] / "r.md"), *trust])
    assert made.exit_code == 0 and (world["dir"] / "r.md").read_text().startswith("## gradsweep: tiny")
    _one_line(runner.invoke(app, ["report", str(world["dir"] / "r.md"), *trust]), "", code=1)


@pytest.mark.parametrize(("candidate", "needle"), [
    ("triton.nope", "not an implementation of rms_norm"),
    ("torch.rms_norm", "never borrows another family's implementation"),
])
def test_check_bad_candidate_is_one_line(candidate: str, needle: str) -> None:
    result = CliRunner().invoke(app, ["check", "--op", "rms_norm", "--profile", "triton_interpret", "--layout",
                                      "bn_full", "--candidate", candidate, "--manifest", str(DEFAULT_MANIFEST)])
    _one_line(result, needle)
    assert not result.stdout


def test_internal_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import gradsweep.ops.registry as registry

    def boom() -> list[str]:
        raise RuntimeError("planted\nbug")

    monkeypatch.setattr(registry, "op_names", boom)
    monkeypatch.delenv("GRADSWEEP_DEBUG", raising=False)
    with pytest.raises(SystemExit) as exited:
        app(["list", "ops"], prog_name="gradsweep")
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert err.strip() == ("gradsweep: error: internal error: RuntimeError: planted bug "
                           "(GRADSWEEP_DEBUG=1 shows the traceback)")


def test_version() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("gradsweep ")


def _commands() -> dict[str, Any]:
    group: Any = typer.main.get_command(app)  # typer's own click: duck-typed
    return dict(group.commands)


def test_one_spelling_per_option_and_readable_metavars() -> None:
    spellings: dict[str, set[tuple[str, ...]]] = {}
    for name, command in _commands().items():
        for param in command.params:
            if param.param_type_name == "option" and not param.hidden:
                spellings.setdefault(param.name, set()).add(tuple(sorted(param.opts)))
        text = command.get_help(command.context_class(command, info_name=name))
        options = text.split("Options:", 1)[-1]
        for metavar in ("<bool>", "<list", "<str>", "<int>", "<float>", "<path>"):
            assert metavar not in options, (name, metavar, options)
        assert "…" not in text, name
    assert "output" not in spellings, "one spelling: --out everywhere"
    assert spellings["out"] == {("--out", "-o")}
    conflicting = {k: v for k, v in spellings.items() if len(v) > 1}
    assert not conflicting, conflicting


def test_tables_are_not_truncated_when_piped(world: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["check", "--op", "a", "--profile", "p1", "--layout", "y",
                                      "--manifest", str(world["manifest"]), *FAKES])
    assert result.exit_code == 0, result.stderr
    assert "…" not in result.stdout
    header = next(line for line in result.stdout.splitlines() if "invariance_check" in line)
    for column in ("mismatched_elements", "accuracy_error", "accuracy_bound", "accuracy_ok"):
        assert column in header
    out = world["dir"] / "ev.json"
    assert _sweep(world, "-o", str(out)).exit_code == 0
    table = CliRunner().invoke(app, ["report", str(out), "--trusted-key", str(world["dir"] / "k.pub.pem")])
    assert table.exit_code == 0 and "…" not in table.stdout
