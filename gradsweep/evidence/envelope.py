"""DSSE envelopes as files: canonical JSON bytes, so that any changed byte is detected.

The file is the RFC 8785 form of ``{payload, payloadType, signatures}``; reading refuses
anything whose bytes are not exactly that canonical form (including non-canonical base64), so no
edit, however 'harmless', passes.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.signer import Signer

from gradsweep.evidence.jsonsafe import canonical

PAYLOAD_TYPE = "application/vnd.in-toto+json"


class EnvelopeError(ValueError):
    """Not a well-formed, canonical gradsweep DSSE envelope."""


def seal(statement: dict[str, Any], signer: Signer) -> bytes:
    """Sign a statement; return the envelope file's bytes."""
    env = Envelope(payload=canonical(statement), payload_type=PAYLOAD_TYPE, signatures={})
    env.sign(signer)
    return canonical(env.to_dict())


def _strict_b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise EnvelopeError(f"{what} is not a base64 string")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError(f"{what} is not valid base64") from None
    if base64.b64encode(raw).decode() != text:
        raise EnvelopeError(f"{what} is not canonical base64")
    return raw


def _compact(doc: Any) -> bytes:
    """RFC 8785 bytes for an envelope document (ASCII strings only: base64, hex, the payload type)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def open_envelope(data: bytes) -> Envelope:
    """Parse envelope bytes strictly (the payload is not decoded: see ``decode_statement``)."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EnvelopeError("not a JSON document") from None
    if not isinstance(doc, dict) or set(doc) != {"payload", "payloadType", "signatures"}:
        raise EnvelopeError("not a DSSE envelope (expected payload, payloadType, signatures)")
    if doc["payloadType"] != PAYLOAD_TYPE:
        raise EnvelopeError(f"payloadType is {doc['payloadType']!r}, expected {PAYLOAD_TYPE}")
    payload = _strict_b64(doc["payload"], "payload")
    sigs = doc["signatures"]
    if not isinstance(sigs, list) or not sigs:
        raise EnvelopeError("envelope has no signatures")
    for sig in sigs:
        if not isinstance(sig, dict) or set(sig) != {"keyid", "sig"}:
            raise EnvelopeError("malformed signature entry (expected keyid, sig)")
        _strict_b64(sig["sig"], "signature")
    if _compact(doc) != data:
        raise EnvelopeError("file is not in canonical form (edited after signing?)")
    envelope = Envelope.from_dict(doc)
    if envelope.payload != payload:
        raise EnvelopeError("payload does not decode consistently")
    return envelope


def decode_statement(payload: bytes) -> dict[str, Any]:
    """The statement in a payload, which must be canonical JSON."""
    try:
        statement = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EnvelopeError("payload is not JSON") from None
    if not isinstance(statement, dict) or canonical(statement) != payload:
        raise EnvelopeError("payload is not a canonical JSON object")
    return statement


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write via a temporary file in the same directory and os.replace: readers never see half a file, and the
    file has ``mode`` whatever was there before (an existing file would keep its mode if truncated in place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)  # evidence is public (0644, not mkstemp's 0600); a private key passes 0600
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
