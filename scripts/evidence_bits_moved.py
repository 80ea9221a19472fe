"""Which cells' outputs moved between two sweep evidence files: the before / after check of a change that must keep
every bit (a kernel reading the same bytes another way, a planner that builds the same plan faster).

The evidence records no output digests, but it records each tensor's normwise error against the FP64 reference to
the float: for the same manifest (same seeds, the same inputs), the same reference and the same contract, that
number is a function of the output's bits, so a tensor whose error differs in any digit changed bits (the converse
does not hold in principle: two outputs can share an error; in practice a moved bit of a dW moves its error).
Both files are verified first (the repository's trust file, or ``--trusted-key``), as ``gradsweep diff`` does.

    python scripts/evidence_bits_moved.py OLD NEW [--op det_gemm --op rms_norm ...] [--profile cuda_bf16 ...]

Prints every compared tensor whose error moved and a count; exits 1 if any moved, 2 if the files share no cell,
3 if either file does not verify (the reason on stderr).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gradsweep.evidence.verify import EvidenceError
from gradsweep.report.readers import open_evidence


def errors(path: Path, keys: list[Path] | None, ops: set[str], profiles: set[str]) -> dict[tuple, float | None]:
    """(op, profile, layout, tensor) -> the recorded accuracy error, for the selected cells."""
    opened = open_evidence(path, keys, None, False)
    out: dict[tuple, float | None] = {}
    for rec in opened.predicate.cells:
        key = rec.result.key
        if (ops and key.op not in ops) or (profiles and key.profile not in profiles):
            continue
        for t in rec.result.tensors:
            out[(key.op, key.profile, key.layout, t.name)] = t.accuracy_error
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--op", action="append", default=[], help="only this op (repeatable)")
    ap.add_argument("--profile", action="append", default=[], help="only this profile (repeatable)")
    ap.add_argument("--trusted-key", action="append", type=Path, default=None, help="public key (PEM), repeatable")
    args = ap.parse_args(argv)
    try:
        before = errors(args.old, args.trusted_key, set(args.op), set(args.profile))
        after = errors(args.new, args.trusted_key, set(args.op), set(args.profile))
    except EvidenceError as exc:
        print(exc, file=sys.stderr)
        return 3
    shared = sorted(set(before) & set(after))
    if not shared:
        print("no cell in common", file=sys.stderr)
        return 2
    moved = [k for k in shared if before[k] != after[k]]
    for k in moved:
        print(f"moved  {'/'.join(k[:3])} {k[3]}: {before[k]!r} -> {after[k]!r}")
    only = len(set(before) ^ set(after))
    print(f"{len(moved)} of {len(shared)} tensors moved ({only} in one file only)")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
