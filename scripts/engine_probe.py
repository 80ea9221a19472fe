"""A bench step's end-to-end time with the autograd engine's backward on its device thread (torch's default) and
on the calling thread (``torch.autograd.set_multithreading_enabled(False)``), on a GPU box: a diagnostic.

Why: the stall probe (scripts/stall_probe.py, 2026-12-04) found no wait for the device in the host-bound rms_norm
and dW steps, but their host time fell from ~370 to ~240 us a step (Triton rms_norm backward) when the backward
ran on the calling thread; stock's fell less (~250 to ~190 us). A per-op bench step makes one backward call, so it
pays the hand-off to the engine's device thread (and the Python backward nodes run on that thread) once per op,
where a trainer's step pays the hand-off once for its whole graph.

Each selected bench case's family and stock steps run in both engine modes, interleaved (``--rounds`` rounds, each
``--seconds`` of back-to-back steps per side and mode, one event pair per 20 steps, the device drained between
chunks as the bench's samples are); printed per side and mode: the median device time per step and its ratio to
stock's in the same mode. Nothing is signed: the figures say what the bench would read under either engine.

    PYTHONPATH=. python3 scripts/engine_probe.py OUT --op det_gemm --op rms_norm --op qk_norm
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import torch

from scripts.host_probe import rotate
from scripts.probe_cases import back_to_back, case_steps, log_to, probe_parser

MODES = ("worker", "caller")


def main() -> None:
    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=0.25)
    args = ap.parse_args()
    say = log_to(args.out, "engine_probe.txt")
    for found in case_steps(args.manifest, args.op, args.case, torch.device("cuda")):
        if isinstance(found, tuple):
            say(f"{found[0].id}: could not build: {found[1]!r}")
            continue
        if found.mode != "fwd_bwd":  # no backward: the engine's thread does not enter
            continue
        samples: dict[tuple[str, str], list[float]] = defaultdict(list)
        steps = {name: rotate(ref.calls) for name, ref in found.refs}
        for r in range(args.rounds):  # the sides and modes in turn: a host that drifts slows each alike
            for name, ref in found.refs:
                with ref.context():
                    if r == 0:
                        for _ in range(3):
                            steps[name]()
                        torch.cuda.synchronize()
                    for mode in MODES:
                        with torch.autograd.set_multithreading_enabled(mode == "worker"):  # restored after
                            samples[(name, mode)] += back_to_back(steps[name], args.seconds)
        med = {k: statistics.median(v) for k, v in samples.items()}
        say(f"{found.case.id} {found.mode}")
        for name in steps:
            cells = []
            for mode in MODES:
                ratio = med[(name, mode)] / med[("stock", mode)] if ("stock", mode) in med else float("nan")
                cells.append(f"{mode} {med[(name, mode)]:8.1f} us ({ratio:.2f}x stock)")
            say(f"    {name:8s} " + "   ".join(cells))


if __name__ == "__main__":
    main()
