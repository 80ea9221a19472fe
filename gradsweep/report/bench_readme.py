"""Regenerate the performance tables (docs/performance.md) from committed bench evidence.

    python -m gradsweep.report.bench_readme EVIDENCE [EVIDENCE ...] [--readme docs/performance.md]
                                     [--trusted-key PUB]... [--trust-file YAML]

Each evidence file (e.g. one per group of ops benched in its own device call) is verified first (the trust
file, or --trusted-key); their tables, in the order given, replace what lies between the file's
``<!-- bench-table:begin -->`` and ``<!-- bench-table:end -->`` markers, written atomically. Nothing else of
the file is touched. Exit 0 written, 1 the evidence does not verify, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gradsweep.evidence.envelope import write_atomic

BEGIN, END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


class ReadmeError(ValueError):
    """A README without the markers, or with them out of order."""


def splice(readme: str, block: str) -> str:
    """The README with the text between the markers replaced by ``block``."""
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < 0 or end < start or readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ReadmeError(f"the README needs exactly one {BEGIN} line and one {END} line after it, around the "
                          "performance table")
    return readme[: start + len(BEGIN)] + "\n" + block + readme[end:]


def portable(path: Path) -> str:
    from gradsweep.evidence.paths import portable_path
    from gradsweep.evidence.source_digest import repo_root

    return portable_path(path, repo_root())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gradsweep.report.bench_readme", description=__doc__.splitlines()[0])
    ap.add_argument("evidence", type=Path, nargs="+")
    ap.add_argument("--readme", type=Path, default=Path(__file__).resolve().parents[2] / "docs" / "performance.md",
                    help="the markdown file holding the table markers (default: docs/performance.md)")
    ap.add_argument("--trusted-key", type=Path, action="append", default=None)
    ap.add_argument("--trust-file", type=Path, default=None)
    args = ap.parse_args(argv)
    from gradsweep.evidence.verify import EvidenceError
    from gradsweep.report.bench import open_bench, readme_block

    for path, what in (*((e, "evidence") for e in args.evidence), (args.readme, "readme")):
        if not path.is_file():
            sys.stderr.write(f"gradsweep: error: {what} {path}: no such file\n")
            return 2
    blocks = []
    for evidence in args.evidence:
        try:
            opened = open_bench(evidence, args.trusted_key, args.trust_file, allow_unverified=False)
        except EvidenceError as exc:
            sys.stderr.write(f"gradsweep: error: {' '.join(str(exc).split())}\n")
            return 1
        blocks.append(readme_block(opened.predicate, portable(evidence)))
    try:
        text = splice(args.readme.read_text(), "\n".join(blocks))
    except ReadmeError as exc:
        sys.stderr.write(f"gradsweep: error: readme {args.readme}: {exc}\n")
        return 2
    write_atomic(args.readme, text.encode())
    sys.stdout.write(f"{args.readme}: performance table regenerated from {', '.join(map(str, args.evidence))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
