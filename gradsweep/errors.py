"""The error every bad input becomes: one line naming the problem, exit code 2, nothing written."""

from __future__ import annotations


class BadInput(Exception):
    """Bad usage, manifest or input file; ``str()`` is the one-line message shown to the user."""


def one_line(message: object) -> str:
    """Collapse a (possibly multi-line) message to one line."""
    return " ".join(str(message).split())
