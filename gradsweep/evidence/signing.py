"""Ed25519 keys for evidence: where they live, how they are made and loaded (who is trusted: trust.py).

The signing key comes from ``--key``, else $GRADSWEEP_KEY, else the per-user default
(~/.config/gradsweep/signing-key.pem), which is created on first use. A public key is written
beside each private key as ``<stem>.pub.pem``. Private keys are always mode 0600 and ``keygen`` refuses
a path inside a repository unless forced.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib.signer import CryptoSigner, SSlibKey

from gradsweep.evidence.envelope import write_atomic

KEY_ENV = "GRADSWEEP_KEY"


class KeyFileError(ValueError):
    """A key that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class TrustedKey:
    """A public key and the file it came from (for messages)."""

    key: SSlibKey
    source: str


def default_key_path() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "gradsweep" / "signing-key.pem"


def public_path_for(private_path: Path) -> Path:
    """signing-key.pem -> signing-key.pub.pem"""
    name = private_path.name
    stem = name[: -len(".pem")] if name.endswith(".pem") else name
    return private_path.with_name(stem + ".pub.pem")


def write_keypair(path: Path, overwrite: bool = False) -> CryptoSigner:
    """Generate an Ed25519 keypair: private key at ``path`` (mode 0600), public key beside it."""
    if path.is_dir():
        raise KeyFileError(f"key {path}: is a directory; give a file path such as {path / 'signing-key.pem'}")
    if path.exists() and not overwrite:
        raise KeyFileError(f"key {path}: already exists; pass --force to replace it")
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()), mode=0o600)
        public_path_for(path).write_bytes(public)
    except OSError as exc:
        raise KeyFileError(f"key {path}: cannot write ({exc.strerror}); choose a writable location") from None
    return CryptoSigner(private)


def enclosing_repository(path: Path) -> Path | None:
    """The checkout (this gradsweep's, or any directory with a .git) that would hold ``path``."""
    from gradsweep.evidence import source_digest

    probe = path.expanduser().resolve().parent
    ours = source_digest.repo_root().resolve()
    for folder in (probe, *probe.parents):
        if folder == ours or (folder / ".git").exists():
            return folder
    return None


def refuse_key_in_repository(path: Path) -> None:
    """A private key inside a repository is one ``git add -A`` away from being published."""
    repo = enclosing_repository(path)
    if repo is not None:
        raise KeyFileError(f"key {path}: is inside the repository {repo}; keep private keys outside any checkout "
                           "(default ~/.config/gradsweep/), or pass --force if the path is git-ignored")


def load_signer(path: Path) -> CryptoSigner:
    """Read an Ed25519 private key (PEM, PKCS#8, unencrypted)."""
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise KeyFileError(f"signing key {path}: is a directory, not a PEM file") from None
    except OSError as exc:
        raise KeyFileError(f"signing key {path}: cannot read ({exc.strerror})") from None
    try:
        private = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"signing key {path}: not an unencrypted PEM private key ({exc})") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path}: not an Ed25519 key; create one with 'gradsweep keygen'")
    return CryptoSigner(private)


def signing_key_location(explicit: Path | None) -> Path:
    """Where the signing key is read from (without reading or creating it): --key, $GRADSWEEP_KEY, default."""
    if explicit is not None:
        return explicit
    env = os.environ.get(KEY_ENV)
    return Path(env) if env else default_key_path()


def resolve_signer(explicit: Path | None, say: Callable[[str], None]) -> tuple[CryptoSigner, Path]:
    """The signing key by precedence --key, $GRADSWEEP_KEY, default path (created on first use)."""
    if explicit is not None:
        return load_signer(explicit), explicit
    env = os.environ.get(KEY_ENV)
    if env:
        return load_signer(Path(env)), Path(env)
    path = default_key_path()
    if not path.exists():
        write_keypair(path)
        say(f"created signing key {path} (public key: {public_path_for(path)}); "
            "share the public key with whoever verifies your evidence")
    return load_signer(path), path


def load_public_key(path: Path) -> TrustedKey:
    """Read an Ed25519 public key (PEM SubjectPublicKeyInfo)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"trusted key {path}: cannot read ({exc.strerror})") from None
    try:
        public = load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"trusted key {path}: not a PEM public key ({exc})") from None
    if not isinstance(public, Ed25519PublicKey):
        raise KeyFileError(f"trusted key {path}: not an Ed25519 public key")
    return TrustedKey(key=SSlibKey.from_crypto(public), source=str(path))
