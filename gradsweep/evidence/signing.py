"""Ed25519 keys for evidence: where they live, how they are made, loaded and trusted.

The signing key comes from ``--key``, else $GRADSWEEP_KEY, else the per-user default
(~/.config/gradsweep/signing-key.pem), which is created on first use. A public key is written
beside each private key as ``<stem>.pub.pem``.
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
    if path.exists() and not overwrite:
        raise KeyFileError(f"key {path}: already exists; pass --force to replace it")
    if path.is_dir():
        raise KeyFileError(f"key {path}: is a directory")
    path.parent.mkdir(parents=True, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public = private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    public_path_for(path).write_bytes(public)
    return CryptoSigner(private)


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


def default_trusted_key_paths(repo: Path) -> list[Path]:
    """The default key's public half (if any) and every evidence/keys/*.pub.pem of the checkout."""
    paths = [public_path_for(default_key_path())]
    paths += sorted((repo / "evidence" / "keys").glob("*.pub.pem"))
    return [p for p in paths if p.is_file()]
