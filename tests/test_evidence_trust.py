"""Trust policy: only the committed trust file's keys verify by default; private keys stay out of the tree.

Issue 9: `keygen -o evidence/keys/x.pem`, sign with it, `verify` -> exit 0 (no pinned trust anchor);
keygen writes a private key inside the repository; `keygen --force` over a 0644 file leaves it 0644;
`.keys/` is not git-ignored; `keygen -o <read-only path>` prints a traceback.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gradsweep.cli import app
from gradsweep.evidence import source_digest
from gradsweep.evidence.signing import write_keypair
from gradsweep.evidence.trust import TrustError, load_trust_file
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest

FAKES = ["--cell-fn", FAKE_CELL, "--manifest-loader", FAKE_LOADER]


@pytest.fixture
def checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in checkout (a .git, evidence/keys/, an empty trust file) that gradsweep treats as its own."""
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "evidence" / "keys").mkdir(parents=True)
    (repo / "gradsweep").mkdir()
    (repo / "gradsweep" / "k.py").write_text("x = 1\n")
    (repo / "evidence" / "trust.yaml").write_text("version: 1\nkeys: []\n")
    monkeypatch.setattr(source_digest, "repo_root", lambda: repo)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return repo


def _signed_evidence(tmp_path: Path, key: Path, name: str = "tiny") -> Path:
    manifest = write_manifest(tmp_path, name=name)
    out = tmp_path / f"{name}.evidence.json"
    result = CliRunner().invoke(app, ["sweep", str(manifest), "-o", str(out), "--key", str(key),
                                      "--no-progress", *FAKES])
    assert result.exit_code == 0, result.stderr
    return out


def _trust(repo: Path, name: str, key: Path, manifests: list[str]) -> None:
    from gradsweep.evidence.signing import load_public_key

    pub = key.with_name(key.name.removesuffix(".pem") + ".pub.pem")
    shutil.copy(pub, repo / "evidence" / "keys" / pub.name)
    entry = {"name": name, "keyid": load_public_key(pub).key.keyid, "public_key": f"keys/{pub.name}",
             "owner": "release team", "manifests": manifests}
    path = repo / "evidence" / "trust.yaml"
    data = yaml.safe_load(path.read_text())
    data["keys"].append(entry)
    path.write_text(yaml.safe_dump(data))


def test_planted_key_in_evidence_keys_is_not_trusted(checkout: Path, tmp_path: Path) -> None:
    planted = checkout / "evidence" / "keys" / "x.pem"
    refused = CliRunner().invoke(app, ["keygen", "-o", str(planted)])
    assert refused.exit_code == 2 and "inside the repository" in refused.stderr
    assert not planted.exists(), "keygen must not write a private key into a checkout without --force"
    forced = CliRunner().invoke(app, ["keygen", "-o", str(planted), "--force"])
    assert forced.exit_code == 0, forced.stderr
    assert (planted.stat().st_mode & 0o777) == 0o600
    evidence = _signed_evidence(tmp_path, planted)
    verified = CliRunner().invoke(app, ["verify", str(evidence), "--allow-stale"])
    assert verified.exit_code == 1, verified.stdout
    assert "untrusted key" in verified.stderr and len(verified.stderr.strip().splitlines()) == 1


def test_trust_file_key_verifies_names_its_signer_and_is_limited_to_its_manifests(checkout: Path,
                                                                                  tmp_path: Path) -> None:
    key = tmp_path / "keys" / "release.pem"
    write_keypair(key)
    _trust(checkout, "release-2026", key, ["tiny*"])
    ok = CliRunner().invoke(app, ["verify", str(_signed_evidence(tmp_path, key)), "--allow-stale"])
    assert ok.exit_code == 0, ok.stderr
    assert "signed by release-2026 (release team)" in ok.stdout and "trusted by trust.yaml" in ok.stdout
    other = _signed_evidence(tmp_path, key, name="other")
    refused = CliRunner().invoke(app, ["verify", str(other), "--allow-stale"])
    assert refused.exit_code == 1 and "does not allow to sign manifest 'other'" in refused.stderr
    adhoc = CliRunner().invoke(app, ["verify", str(other), "--allow-stale", "--trusted-key",
                                     str(key.with_name("release.pub.pem"))])
    assert adhoc.exit_code == 0 and "trusted by --trusted-key" in adhoc.stdout


def test_trust_file_pins_keyids(checkout: Path, tmp_path: Path) -> None:
    key = tmp_path / "release.pem"
    write_keypair(key)
    _trust(checkout, "release", key, ["*"])
    assert [s.name for s in load_trust_file(checkout / "evidence" / "trust.yaml")] == ["release"]
    write_keypair(tmp_path / "swap.pem")
    shutil.copy(tmp_path / "swap.pub.pem", checkout / "evidence" / "keys" / "release.pub.pem")
    with pytest.raises(TrustError, match="a key file was replaced"):
        load_trust_file(checkout / "evidence" / "trust.yaml")
    result = CliRunner().invoke(app, ["verify", str(_signed_evidence(tmp_path, key))])
    assert result.exit_code == 2 and "a key file was replaced" in result.stderr


def test_committed_trust_file_pins_the_release_key() -> None:
    signers = load_trust_file(REPO / "evidence" / "trust.yaml")
    assert signers, "evidence/trust.yaml lists no key"
    by_name = {s.name: s for s in signers}
    assert "h200-release" in by_name and by_name["h200-release"].may_sign("h200")
    assert not by_name["h200-release"].may_sign("default")


def test_keygen_force_always_leaves_a_0600_key(tmp_path: Path) -> None:
    path = tmp_path / "k.pem"
    path.write_text("old\n")
    path.chmod(0o644)
    result = CliRunner().invoke(app, ["keygen", "-o", str(path), "--force"])
    assert result.exit_code == 0, result.stderr
    assert (path.stat().st_mode & 0o777) == 0o600
    assert "keyid:" in result.stdout and "public_key: keys/k.pub.pem" in result.stdout


@pytest.mark.parametrize("where", ["read-only", "under a file"])
def test_keygen_unwritable_path_is_one_line(tmp_path: Path, where: str) -> None:
    if where == "read-only":
        if not Path("/sys").is_dir():
            pytest.skip("no /sys (a path even root cannot write)")
        target = Path("/sys/gradsweep-test-key.pem")
    else:
        (tmp_path / "file").write_text("x")
        target = tmp_path / "file" / "k.pem"
    result = CliRunner().invoke(app, ["keygen", "-o", str(target)])
    assert result.exit_code == 2, (result.exception, result.stderr)
    assert result.stderr.startswith("gradsweep: error: ") and len(result.stderr.strip().splitlines()) == 1
    assert "cannot write" in result.stderr


def test_private_keys_are_git_ignored() -> None:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [".keys/release.pem", "evidence/keys/x.pem", "x.pem", "evidence/keys/h200-release.pub.pem"]
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO, capture_output=True, text=True,
                          check=False)
    ignored = set(done.stdout.split())
    assert ignored == {".keys/release.pem", "evidence/keys/x.pem", "x.pem"}, done.stdout
