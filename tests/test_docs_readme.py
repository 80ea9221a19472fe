"""The README and docs/ say only what exists: files they name, links inside the repository, real options.

Issue 9: the verify example names files that do not exist; the README links a design file outside the
repository.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer

from gradsweep.cli import app

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:evidence|manifests|scripts|docs|\.github)/[\w./-]+"
                       r"\.(?:json|yaml|yml|sh|md|pem))")


def _code_blocks(text: str) -> list[str]:
    return re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)


def test_design_lives_in_the_repository() -> None:
    assert (REPO / "docs" / "design.md").is_file()
    assert "shared/DESIGN.md" not in (REPO / "README.md").read_text()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_links_stay_inside_the_repository(doc: Path) -> None:
    for target in LINK.findall(doc.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        resolved = (doc.parent / target).resolve()
        assert resolved.is_relative_to(REPO), f"{doc.name} links outside the repository: {target}"
        assert resolved.exists(), f"{doc.name} links to a missing file: {target}"


def test_named_repository_files_exist() -> None:
    doc = REPO / "README.md"
    for block in _code_blocks(doc.read_text()):
        for path in REPO_PATH.findall(block):
            if "*" in path or "<" in path:
                continue
            assert (REPO / path).exists(), f"{doc.name} names {path}, which does not exist"


def _options() -> dict[str, set[str]]:
    group: Any = typer.main.get_command(app)
    return {name: {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}
            for name, cmd in group.commands.items()}


def test_readme_commands_use_real_options() -> None:
    options = _options()
    current: str | None = None
    for block in _code_blocks((REPO / "README.md").read_text()):
        for line in block.splitlines():
            found = re.search(r"(?:^|[\s;(])gradsweep\s+([a-z]+)", line)
            if found:
                current = found.group(1) if found.group(1) in options else None
                line = line[found.end():]
            elif not line.startswith(" "):
                current = None
            if current is None:
                continue
            code = line.split("#", 1)[0]
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-[a-z])\b", code):
                assert flag in options[current], f"README: gradsweep {current} has no option {flag}"
