"""A/B of extension builds on a GPU box, in one device call: each side's GPU tests, the bits of every bench step
of the chosen ops against the first side's, and ``gradsweep bench`` of those ops with the sides in alternation
(A B A B ...), the rows collected in one table. What the tenth session's dK / dV calls did by hand
(bench/results/dkdv_split_2026-12-02/run.sh, dkdv_stages_2026-12-02/run.sh); a diagnostic, never evidence.

A side is ``NAME=DIR`` (DIR holds the side's ``_C.cpython-*.so``, built on the CPU box with the device's Python)
with optional ``:VAR=VALUE`` environment settings (a variant picked inside one build):

    python3 scripts/ab_builds.py OUT --side main=.devtmp/ab/old --side s4=.devtmp/ab/new:MY_VARIANT=4 \\
        --op attention --family cuda --tests tests/test_cuda_attention.py --rounds 2

Each side's extension is copied to gradsweep/ before its steps (the import picks it up in the fresh process that
runs them). ``--dry-run`` prints the steps without running them. Writes OUT/ab.txt (everything) and prints the
bench rows last.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Side:
    """One build (and variant) under test."""

    name: str
    build: Path
    env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def parse(text: str) -> Side:
        name, sep, rest = text.partition("=")
        if not sep or not name or not rest:
            raise argparse.ArgumentTypeError(f"--side {text!r}: use NAME=DIR[:VAR=VALUE...]")
        build, *settings = rest.split(":")
        env = {}
        for item in settings:
            var, eq, value = item.partition("=")
            if not eq or not var:
                raise argparse.ArgumentTypeError(f"--side {text!r}: {item!r} is not VAR=VALUE")
            env[var] = value
        return Side(name, Path(build), env)


@dataclass(frozen=True)
class Step:
    """One command of the plan, run with a side's extension and environment (side None: no extension swap)."""

    side: Side | None
    argv: list[str]
    title: str


def plan(sides: list[Side], ops: list[str], families: list[str], cases: list[str], tests: list[str],
         rounds: int, dump_dir: Path) -> list[Step]:
    """The steps in order: tests and a bits dump per side, the comparisons, then the benches in alternation."""
    py = sys.executable
    op_args = [a for op in ops for a in ("--op", op)]
    sel = op_args + [a for c in cases for a in ("--case", c)]
    fam = [a for f in families for a in ("--family", f)]
    steps: list[Step] = []
    for side in sides:
        if tests:
            steps.append(Step(side, [py, "-m", "pytest", "-q", "-m", "gpu", *tests], f"tests [{side.name}]"))
        steps.append(Step(side, [py, "scripts/bits_dump.py", "dump", str(dump_dir / f"{side.name}.pt"), *sel, *fam],
                          f"bits dump [{side.name}]"))
    for side in sides[1:]:
        steps.append(Step(None, [py, "scripts/bits_dump.py", "compare", str(dump_dir / f"{sides[0].name}.pt"),
                                 str(dump_dir / f"{side.name}.pt")], f"bits {sides[0].name} vs {side.name}"))
    for r in range(rounds):
        for side in sides:
            steps.append(Step(side, [py, "-m", "gradsweep.cli", "bench", "manifests/h200.yaml", *op_args, *fam,
                                     "-o", str(dump_dir / f"bench_{side.name}_{r}.json"), "--key",
                                     str(dump_dir / "ab.pem"), "--force"], f"bench [{side.name}] round {r + 1}"))
    return steps


def _use(side: Side) -> None:
    built = sorted(side.build.glob("_C.cpython-*.so"))
    if not built:
        raise SystemExit(f"--side {side.name}: no _C.cpython-*.so in {side.build}")
    for so in built:
        shutil.copy2(so, ROOT / "gradsweep" / so.name)


def run(steps: list[Step], log: Path) -> list[str]:
    """Run every step (a failing one is logged and the next runs); return the bench rows."""
    rows: list[str] = []
    with log.open("a") as out:
        for step in steps:
            env = dict(os.environ)
            if step.side is not None:
                _use(step.side)
                env.update(step.side.env)
            proc = subprocess.run(step.argv, cwd=ROOT, env=env, capture_output=True, text=True)
            text = proc.stdout + proc.stderr
            out.write(f"== {step.title}: rc={proc.returncode}\n{text}\n")
            out.flush()
            print(f"== {step.title}: rc={proc.returncode}", flush=True)
            if step.title.startswith("bench"):
                rows += [f"{step.title}: {line.strip()}" for line in text.splitlines() if line.startswith("│")]
            elif step.title.startswith(("bits", "tests")):
                print("\n".join(text.strip().splitlines()[-6:]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--side", action="append", type=Side.parse, required=True, help="NAME=DIR[:VAR=VALUE...]")
    ap.add_argument("--op", action="append", required=True)
    ap.add_argument("--family", action="append", default=[], help="cuda and / or triton (bench and bits)")
    ap.add_argument("--case", action="append", default=[], help="bits: only bench cases whose id contains this")
    ap.add_argument("--tests", action="append", default=[], help="GPU test files run on every side")
    ap.add_argument("--rounds", type=int, default=2, help="bench rounds (each runs every side once)")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()
    if len({s.name for s in args.side}) != len(args.side) or len(args.side) < 2:
        raise SystemExit("--side: give at least two sides with distinct names")
    families = args.family or ["cuda", "triton"]
    dump_dir = Path(os.environ.get("TMPDIR", "/tmp")) / "ab_builds"
    steps = plan(args.side, args.op, families, args.case, args.tests, args.rounds, dump_dir)
    if args.dry_run:
        for step in steps:
            env = " ".join(f"{k}={v}" for k, v in (step.side.env if step.side else {}).items())
            swap = f"[{step.side.name}: {step.side.build}] " if step.side else ""
            print(f"{step.title}: {swap}{env + ' ' if env else ''}{' '.join(step.argv[1:])}")
        return
    args.out.mkdir(parents=True, exist_ok=True)
    dump_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "gradsweep.cli", "keygen", "-o", str(dump_dir / "ab.pem"), "--force"],
                   cwd=ROOT, capture_output=True)
    rows = run(steps, args.out / "ab.txt")
    table = "\n".join(rows)
    (args.out / "ab_rows.txt").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
