"""Output paths that never destroy anything by surprise.

An output is refused (BadInput, before anything is written) when it is a directory, cannot be
created, is one of the command's inputs (manifest, contract, tracked reds, signing key, trust file,
shard, evidence being read), or already holds something that is not this command's to replace:
evidence of another manifest, or a file that is not evidence at all (``--force`` replaces those).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from gradsweep.errors import BadInput


def _same_file(a: Path, b: Path) -> bool:
    try:
        if a.exists() and b.exists():
            return os.path.samefile(a, b)
    except OSError:
        pass
    return a.resolve() == b.resolve()


def check_writable(out: Path, flag: str = "--out", make_dirs: bool = True) -> None:
    """``out`` is a file path whose directory exists (or, with ``make_dirs``, can be made) and is writable."""
    if out.is_dir():
        raise BadInput(f"{flag} {out}: is a directory; give a file path")
    if not make_dirs and not (out.parent if str(out.parent) else Path(".")).is_dir():
        raise BadInput(f"{flag} {out}: directory {out.parent} does not exist")
    probe = out.parent if str(out.parent) else Path(".")
    while not probe.exists():
        if probe == probe.parent:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise BadInput(f"{flag} {out}: {probe} is not a directory")
    if not os.access(probe, os.W_OK):
        raise BadInput(f"{flag} {out}: {probe} is not writable")


def check_not_input(outs: Mapping[str, Path], inputs: Mapping[str, Path | None], flag: str = "--out") -> None:
    """No output (the evidence and the files written beside it) may be one of the inputs."""
    for out_what, out in outs.items():
        for what, path in inputs.items():
            if path is not None and _same_file(out, path):
                named = "" if out_what == "output" else f" (its {out_what})"
                raise BadInput(f"{flag} {outs['output']}{named}: is the {what} {path}; writing there would "
                               "destroy it, choose another path")


def existing_evidence_owner(out: Path) -> str | None:
    """The manifest name of the evidence at ``out``; raises BadInput-worthy text via ValueError if the file
    is not gradsweep evidence."""
    from gradsweep.evidence.verify import EvidenceError, read_evidence

    try:
        return read_evidence(out).manifest.name
    except EvidenceError:
        raise ValueError("not gradsweep evidence") from None


def check_replace_evidence(out: Path, manifest_name: str, force: bool, flag: str = "--out") -> None:
    """Replacing evidence of the same manifest is a rerun; anything else needs ``--force``."""
    if force or not out.exists():
        return
    try:
        owner = existing_evidence_owner(out)
    except ValueError:
        raise BadInput(f"{flag} {out}: exists and is not gradsweep evidence; pass --force to replace it") from None
    if owner != manifest_name:
        raise BadInput(f"{flag} {out}: holds evidence of manifest {owner!r}, not {manifest_name!r}; pass --force "
                       "to replace it")


def check_not_evidence(out: Path, flag: str = "--out") -> None:
    """A rendering (report) never replaces an evidence file."""
    if not out.exists():
        return
    try:
        owner = existing_evidence_owner(out)
    except ValueError:
        return
    raise BadInput(f"{flag} {out}: is gradsweep evidence (manifest {owner!r}); a report never replaces evidence, "
                   "choose another path")
