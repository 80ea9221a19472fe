"""Signing keys: precedence --key > $GRADSWEEP_KEY > default path created on first use."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from gradsweep.evidence.signing import (  # noqa: E402
    KeyFileError,
    default_key_path,
    load_public_key,
    load_signer,
    resolve_signer,
    write_keypair,
)


def test_default_key_created_on_first_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GRADSWEEP_KEY", raising=False)
    said: list[str] = []
    signer, path = resolve_signer(None, said.append)
    assert path == default_key_path() == tmp_path / "cfg" / "gradsweep" / "signing-key.pem"
    assert path.is_file() and (path.parent / "signing-key.pub.pem").is_file()
    assert len(said) == 1 and str(path) in said[0]
    assert (path.stat().st_mode & 0o777) == 0o600
    again, _ = resolve_signer(None, said.append)
    assert len(said) == 1 and again.public_key.keyid == signer.public_key.keyid
    assert load_public_key(path.parent / "signing-key.pub.pem").key.keyid == signer.public_key.keyid


def test_env_and_explicit_key_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_key = write_keypair(tmp_path / "env.pem")
    cli_key = write_keypair(tmp_path / "cli.pem")
    monkeypatch.setenv("GRADSWEEP_KEY", str(tmp_path / "env.pem"))
    assert resolve_signer(None, print)[0].public_key.keyid == env_key.public_key.keyid
    assert resolve_signer(tmp_path / "cli.pem", print)[0].public_key.keyid == cli_key.public_key.keyid


def test_unusable_keys(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        load_signer(tmp_path / "missing.pem")
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(KeyFileError, match="not an unencrypted PEM"):
        load_signer(tmp_path / "junk.pem")
    with pytest.raises(KeyFileError, match="directory"):
        load_signer(tmp_path)
    write_keypair(tmp_path / "k.pem")
    with pytest.raises(KeyFileError, match="already exists"):
        write_keypair(tmp_path / "k.pem")
