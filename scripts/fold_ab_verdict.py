"""The verdict of a fold A/B (scripts/fold_ab_call.sh's OUT): did the candidate `_C` keep its bits and gain?

Why: a patch to the CUDA fold may enter a signing call only if it is proven there, before the sweep, on the card
that signs (closeout_call.sh's GATE reverses it otherwise). Proven means: the fold's GPU tests passed on the
candidate (gputest.txt), and its fold kernel, as a ratio to the cuBLAS bf16 ``dY^T X`` timed in the same process,
is at least GAIN faster than the reference's at T (the mean of the A B A B rounds; ratios, not microseconds, since
each process times its own cuBLAS). Prints both means per T; exit 0 proven, 1 not, 2 unreadable.

    python3 scripts/fold_ab_verdict.py OUT [--gain 0.03] [--at 4096]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

CASE = re.compile(r"^T=(\d+) ")
DEFAULT = re.compile(r"^\s+default\s+[\d.]+ us\s+\(([\d.]+)x cuBLAS")


def fold_ratios(text: str) -> dict[int, float]:
    """T -> the production fold's ratio to cuBLAS bf16 in one fold_io_probe.py --plain output."""
    out: dict[int, float] = {}
    t = None
    for line in text.splitlines():
        if m := CASE.match(line):
            t = int(m.group(1))
        elif (m := DEFAULT.match(line)) and t is not None:
            out[t] = float(m.group(1))
    return out


def tests_passed(text: str) -> bool:
    """pytest's last line says passed and nothing failed or errored."""
    last = text.strip().splitlines()[-1] if text.strip() else ""
    return " passed" in last and "failed" not in last and "error" not in last


def mean_ratios(out: Path, side: str) -> dict[int, float]:
    runs = [fold_ratios(p.read_text()) for p in sorted(out.glob(f"{side}[0-9]*.txt"))]
    runs = [r for r in runs if r]
    if not runs:
        return {}
    ts = set.intersection(*(set(r) for r in runs))
    return {t: sum(r[t] for r in runs) / len(runs) for t in sorted(ts)}


def verdict(out: Path, gain: float, at: int) -> tuple[int, str]:
    lines = []
    gputest = out / "gputest.txt"
    passed = gputest.is_file() and tests_passed(gputest.read_text())
    lines.append(f"candidate GPU tests: {'passed' if passed else 'NOT passed'}")
    ref, cand = mean_ratios(out, "ref"), mean_ratios(out, "cand")
    for t in sorted(set(ref) & set(cand)):
        lines.append(f"T={t}: reference {ref[t]:.3f}x, candidate {cand[t]:.3f}x cuBLAS bf16 "
                     f"({cand[t] / ref[t] - 1:+.1%})")
    if at not in ref or at not in cand:
        return 2, "\n".join([*lines, f"no T={at} figure on both sides"])
    proven = passed and cand[at] <= (1.0 - gain) * ref[at]
    lines.append(f"{'PROVEN' if proven else 'NOT PROVEN'}: the candidate must pass its tests and be >= {gain:.0%} "
                 f"faster at T={at}")
    return (0 if proven else 1), "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--gain", type=float, default=0.03)
    ap.add_argument("--at", type=int, default=4096)
    args = ap.parse_args(argv)
    rc, text = verdict(args.out, args.gain, args.at)
    print(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
