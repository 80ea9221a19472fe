"""Bad input: one line naming the problem on stderr, exit code 2, and no file written."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence.signing import write_keypair
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, write_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    write_keypair(tmp_path / "k.pem")
    (tmp_path / "out").mkdir()
    (tmp_path / "broken.yaml").write_text("name: [unclosed\n  ops: {")
    (tmp_path / "junk.pem").write_text("not a key\n")
    (tmp_path / "src").mkdir()
    return {"dir": tmp_path, "manifest": write_manifest(tmp_path / "src"), "key": tmp_path / "k.pem"}


CASES = {
    "malformed YAML": (["{broken}"], "malformed YAML"),
    "missing manifest": (["{dir}/nope.yaml"], "no such file"),
    "manifest is a directory": (["{dir}"], "is a directory"),
    "unknown op": (["{manifest}", "--op", "zz"], "unknown op 'zz'"),
    "unknown profile": (["{manifest}", "--profile", "gpu9"], "unknown profile 'gpu9'"),
    "unknown layout": (["{manifest}", "--layout", "diagonal"], "unknown layout 'diagonal'"),
    "unreadable key": (["{manifest}", "--key", "{dir}/missing.pem"], "cannot read"),
    "key not a PEM": (["{manifest}", "--key", "{dir}/junk.pem"], "not an unencrypted PEM"),
    "output is a directory": (["{manifest}", "-o", "{dir}/out"], "is a directory"),
    "shard 3/2": (["{manifest}", "--shard", "3/2"], "--shard '3/2'"),
    "shard not K/N": (["{manifest}", "--shard", "half"], "expected K/N"),
    "zero jobs": (["{manifest}", "--jobs", "0"], "--jobs 0"),
    "missing tracked file": (["{manifest}", "--tracked", "{dir}/none.yaml"], "no such file"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exits_2_with_one_line_and_writes_nothing(world: dict[str, Path], case: str) -> None:
    args, needle = CASES[case]
    args = [a.format(dir=world["dir"], manifest=world["manifest"], broken=world["dir"] / "broken.yaml")
            for a in args]
    if "--key" not in args:
        args += ["--key", str(world["key"])]
    out = world["dir"] / "out" / "ev.json"
    if "-o" not in args:
        args += ["-o", str(out)]
    before = sorted(p for p in world["dir"].rglob("*"))
    result = CliRunner().invoke(app, ["sweep", *args, *FAKES])
    assert result.exit_code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gradsweep: error: "), result.stderr
    assert needle in lines[0]
    assert sorted(p for p in world["dir"].rglob("*")) == before, "bad input must not write any file"
    assert not result.stdout.strip()


def test_malformed_tracked_file_exits_2(world: dict[str, Path]) -> None:
    (world["manifest"].parent / "tracked_reds.yaml").write_text("tracked: [ {cell: a/b, reason: r, fix: f} ]")
    result = CliRunner().invoke(app, ["sweep", str(world["manifest"]), "--key", str(world["key"]),
                                      "-o", str(world["dir"] / "ev.json"), *FAKES])
    assert result.exit_code == 2 and "tracked reds" in result.stderr
    assert not (world["dir"] / "ev.json.partial.jsonl").exists()


def test_other_commands_bad_input(world: dict[str, Path]) -> None:
    runner = CliRunner()
    missing = str(world["dir"] / "missing.json")
    for args in (["report", missing], ["diff", missing, missing],
                 ["verify", missing, "--trusted-key", str(world["dir"] / "junk.pem")],
                 ["check", "--op", "zz", "--profile", "p1", "--layout", "x",
                  "--manifest", str(world["manifest"]), *FAKES]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
