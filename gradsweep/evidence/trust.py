"""Who may sign evidence: the committed trust file is the only default trust anchor.

``evidence/trust.yaml`` lists each trusted key by name, pins its keyid, says who holds the private
key and which manifests it may sign. A public key dropped into ``evidence/keys/`` is trusted by
nothing: only an entry in the (reviewed, committed) trust file makes it a signer. ``--trusted-key``
stays as an explicit, ad-hoc override (any manifest), for checking evidence you made yourself.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gradsweep.evidence import source_digest
from gradsweep.evidence.signing import KeyFileError, TrustedKey, load_public_key

TRUST_FILE = Path("evidence") / "trust.yaml"


class TrustError(ValueError):
    """A trust file that cannot be used; the message names the file, the field and the fix."""


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, description="short name shown by verify, e.g. h200-release")
    keyid: str = Field(pattern=r"^[0-9a-f]{64}$", description="the key's id as 'gradsweep keygen' prints it")
    public_key: str = Field(min_length=1, description="PEM public key, relative to the trust file")
    owner: str = Field(min_length=1, description="who holds the private key")
    manifests: list[str] = Field(min_length=1, description="manifest names (fnmatch patterns) it may sign")


class _TrustFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = 1
    keys: list[_Entry] = Field(default_factory=list)


@dataclass(frozen=True)
class Signer:
    """A trusted key with its identity and what it may sign (``manifests`` None: anything, ad hoc)."""

    trusted: TrustedKey
    name: str
    owner: str
    manifests: tuple[str, ...] | None
    origin: str  # the trust file, or "--trusted-key"

    @property
    def keyid(self) -> str:
        return self.trusted.key.keyid

    def may_sign(self, manifest_name: str) -> bool:
        return self.manifests is None or any(fnmatchcase(manifest_name, p) for p in self.manifests)

    def describe(self) -> str:
        who = f"{self.name} ({self.owner})" if self.owner else self.name
        return f"{who}, keyid {self.keyid[:16]}, trusted by {self.origin}"


def default_trust_file() -> Path:
    """evidence/trust.yaml of the checkout that holds this gradsweep."""
    return source_digest.repo_root() / TRUST_FILE


def load_trust_file(path: Path) -> list[Signer]:
    """Read and check a trust file: every key file must exist and hash to its pinned keyid."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise TrustError(f"trust file {path}: cannot read ({exc.strerror}); pass --trusted-key PUB.pem "
                         "for an ad-hoc check") from None
    except yaml.YAMLError:
        raise TrustError(f"trust file {path}: malformed YAML; fix the syntax") from None
    try:
        parsed = _TrustFile.model_validate(data or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise TrustError(f"trust file {path}: field '{loc}': {err['msg']}") from None
    signers = []
    for i, entry in enumerate(parsed.keys):
        key_path = path.parent / entry.public_key
        try:
            trusted = load_public_key(key_path)
        except KeyFileError as exc:
            raise TrustError(f"trust file {path}: keys.{i} ({entry.name}): {exc}") from None
        if trusted.key.keyid != entry.keyid:
            raise TrustError(f"trust file {path}: keys.{i} ({entry.name}): {entry.public_key} has keyid "
                             f"{trusted.key.keyid}, the entry pins {entry.keyid}; a key file was replaced "
                             "or the entry is wrong")
        signers.append(Signer(trusted=trusted, name=entry.name, owner=entry.owner,
                              manifests=tuple(entry.manifests), origin=path.name))
    return signers


def ad_hoc_signers(paths: list[Path]) -> list[Signer]:
    """Keys given with --trusted-key: trusted for any manifest, named by their file."""
    signers = []
    for path in paths:
        trusted = load_public_key(path)
        signers.append(Signer(trusted=trusted, name=path.name, owner="", manifests=None,
                              origin="--trusted-key"))
    return signers


def resolve_signers(trusted_keys: list[Path] | None, trust_file: Path | None) -> list[Signer]:
    """--trusted-key keys when given (ad hoc), else the trust file (default evidence/trust.yaml)."""
    if trusted_keys:
        try:
            return ad_hoc_signers(list(trusted_keys))
        except KeyFileError as exc:
            raise TrustError(str(exc)) from None
    return load_trust_file(trust_file or default_trust_file())
