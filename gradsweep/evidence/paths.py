"""Paths as evidence records them: relative to the checkout, never a machine's absolute path.

Committed evidence must not leak home directories or build-box layouts, and a verifier on another
machine must find the recorded inputs in its own checkout. A file inside the checkout is recorded by
its repository-relative POSIX path; a file outside it by ``<external>/<file name>`` (clearly not a
path of the checkout, so freshness checks know they cannot compare it).
"""

from __future__ import annotations

from pathlib import Path

EXTERNAL = "<external>"


def portable_path(path: Path | str, root: Path) -> str:
    """Repository-relative POSIX path, or ``<external>/<name>`` for a file outside ``root``."""
    path = Path(path)
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return f"{EXTERNAL}/{path.name}"


def is_external(recorded: str) -> bool:
    return recorded.startswith(EXTERNAL + "/")


def resolve_recorded(recorded: str | None, root: Path) -> Path | None:
    """The file a recorded path names in the checkout at ``root`` (None when it was outside a checkout)."""
    if not recorded or is_external(recorded) or Path(recorded).is_absolute():
        return None
    return root / recorded


def _looks_like_path(token: str) -> bool:
    return token.startswith(("/", "~"))


def portable_argv(argv: list[str], root: Path) -> list[str]:
    """The command line with the program named ``gradsweep`` and absolute paths made portable."""
    if not argv:
        return []
    out = ["gradsweep"]
    for token in argv[1:]:
        if token.startswith("--") and "=" in token:
            flag, value = token.split("=", 1)
            out.append(f"{flag}={portable_path(Path(value).expanduser(), root)}" if _looks_like_path(value)
                       else token)
        elif _looks_like_path(token):
            out.append(portable_path(Path(token).expanduser(), root))
        else:
            out.append(token)
    return out
