"""Whether two builds give the same bits: dump every output and gradient of the bench steps of chosen ops (one
process per build), then compare two dumps raw bit for bit. A device check for kernel changes that claim
"same arithmetic, same bits" (a restructured program, a split launch), beside the sweep, which judges each build
on its own; a diagnostic, not evidence.

    python3 scripts/bits_dump.py dump a.pt --op attention --family cuda    # build A's _C.*.so in gradsweep/
    python3 scripts/bits_dump.py dump b.pt --op attention --family cuda    # build B's _C.*.so in gradsweep/
    python3 scripts/bits_dump.py compare a.pt b.pt

(``scripts/ab_builds.py`` swaps the builds' extensions and runs both dumps and the comparison in one call.)

A dump holds, per bench case and family, the step's outputs and gradients in logical token order
(``OpStep.collect``: main grads zeroed first, so folded parameter grads are this step's alone), on the host.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # ``python3 scripts/bits_dump.py`` from the repository root, PYTHONPATH elsewhere
    sys.path.append(str(ROOT))

from gradsweep.bench.checks import compare_logical  # noqa: E402
from gradsweep.bench.runner import OpStep  # noqa: E402


def dump(out: Path, manifest: str, ops: list[str], cases: list[str], families: list[str]) -> int:
    """Collect every selected step once; write {"case [family]": {tensor: host tensor}}; return the count."""
    from scripts.probe_cases import case_steps

    found: dict[str, dict[str, torch.Tensor]] = {}
    for steps in case_steps(manifest, ops, cases, torch.device("cuda")):
        if isinstance(steps, tuple):
            raise SystemExit(f"{steps[0].id}: subject failed: {steps[1]}")
        for family, ref in steps.refs:
            step = ref.calls[0]
            if family not in families or not isinstance(step, OpStep):
                continue
            with ref.context():
                step()  # plans and caches warm, as the bench's first step
                got = step.collect()
            found[f"{steps.case.id} [{family}]"] = {k: v.detach().cpu() for k, v in got.items()}
            print(f"{steps.case.id} [{family}]: {', '.join(sorted(got))}", flush=True)
    torch.save(found, out)
    return len(found)


def compare(a: Path, b: Path) -> tuple[list[str], bool]:
    """One line per step: equal, or what differs (raw bits, NaN-aware, as the bench's checks); steps in one dump
    only are named. Also whether every step is in both dumps and equal."""
    da, db = torch.load(a), torch.load(b)
    lines, same = [], bool(da or db)
    for key in sorted(set(da) | set(db)):
        if key not in da or key not in db:
            lines.append(f"{key}: only in {'the first' if key in da else 'the second'} dump")
            same = False
            continue
        diffs = compare_logical(da[key], db[key])
        same = same and not diffs
        lines.append(f"{key}: {'bitwise equal' if not diffs else 'DIFFERS: ' + '; '.join(diffs[:6])}"
                     f" ({len(da[key])} tensors)")
    return lines, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--manifest", default="manifests/h200.yaml")
    d.add_argument("--op", action="append", default=[], required=True)
    d.add_argument("--case", action="append", default=[], help="only cases whose id contains one of these")
    d.add_argument("--family", action="append", default=[], required=True, help="cuda, triton or stock")
    c = sub.add_parser("compare")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    args = ap.parse_args()
    if args.cmd == "dump":
        n = dump(args.out, args.manifest, args.op, args.case, args.family)
        print(f"{n} steps dumped to {args.out}")
        return
    lines, same = compare(args.a, args.b)
    print("\n".join(lines))
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
