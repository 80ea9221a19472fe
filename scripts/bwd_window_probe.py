"""The backward's device time inside one profiled training step, by launch correlation: a diagnostic for the
bench's derived ``bwd`` kernels-only figure (a difference of two profiled rounds, which moves ~10% between runs).

For each selected bench case (the steps ``gradsweep bench`` times, scripts/probe_cases.py) and each side, the
``fwd_bwd`` step runs ``--steps`` times under torch's profiler with its backward marked on the host
(``record_function("gs::bwd")`` opened at the step's first ``torch.autograd.backward`` call and closed when the
step returns, so the folds' finish is inside). From the raw kineto events it takes every device event, finds the
runtime or driver call that launched it (the two share ``correlation_id``) and puts it in the
backward when that call started inside a mark. It prints per step: device busy time in all, in the backward, in
the forward, unlinked (a device event whose launch the trace lacks: such a figure would be lost), and the bench's
derived figure (the same step's busy time minus a profiled ``fwd_train`` round's). Diagnostics only.

    PYTHONPATH=. python3 scripts/bwd_window_probe.py OUT --op det_gemm --case dw_t
"""

from __future__ import annotations

import statistics

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from scripts.probe_cases import log_to, probe_parser, training_steps

MARK = "gs::bwd"


class BackwardMark:
    """Opens the mark at a step's first backward call; ``close()`` ends it (once per step)."""

    def __init__(self) -> None:
        self.open: record_function | None = None
        self._orig = torch.autograd.backward

    def __enter__(self) -> BackwardMark:
        def backward(*args, **kwargs):
            if self.open is None:
                self.open = record_function(MARK)
                self.open.__enter__()
            return self._orig(*args, **kwargs)
        torch.autograd.backward = backward
        return self

    def close(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
            self.open = None

    def __exit__(self, *exc) -> None:
        self.close()
        torch.autograd.backward = self._orig


def _kineto_events(prof) -> list:
    return list(prof.profiler.kineto_results.events())


def _is_device(e) -> bool:
    return str(e.device_type()).endswith("CUDA")


def split_busy(prof) -> dict[str, float]:
    """Device ns in all / in the backward / in the forward / unlinked, from one profiled round."""
    events = _kineto_events(prof)
    marks = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == MARK]
    # runtime / driver calls only (cudaLaunchKernel, cuLaunchKernelEx, cudaMemcpyAsync, ...): a torch op's own
    # correlation id lives in another id space
    launches = {e.correlation_id(): e.start_ns() for e in events
                if not _is_device(e) and e.correlation_id() > 0 and e.name().startswith("cu")}
    total = bwd = fwd = lost = 0
    for e in events:
        if not _is_device(e) or e.duration_ns() <= 0:
            continue
        if "annotation" in e.name().lower() or e.name() == MARK:
            continue
        d = e.duration_ns()
        total += d
        start = launches.get(e.correlation_id())  # a device event carries its launch's id (torch 2.11)
        if start is None:
            lost += d
        elif any(a <= start <= b for a, b in marks):
            bwd += d
        else:
            fwd += d
    return {"total": total, "bwd": bwd, "fwd": fwd, "lost": lost, "marks": len(marks)}


def _round(step, n: int, mark: BackwardMark | None) -> dict[str, float]:
    for _ in range(3):
        step()
        if mark is not None:
            mark.close()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            step()
            if mark is not None:
                mark.close()
        torch.cuda.synchronize()
    return split_busy(prof)


def main() -> None:
    ap = probe_parser(__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    say = log_to(args.out, "bwd_window_probe.txt")
    device = torch.device("cuda")
    say(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for item in training_steps(args.manifest, args.op, args.case, device, say):
        for side, ref in item.refs:
            step = ref.calls[0]
            rows: dict[str, list[float]] = {"total": [], "bwd": [], "fwd": [], "lost": [], "derived": []}
            with ref.context():
                for _ in range(args.rounds):
                    with BackwardMark() as mark:
                        split = _round(step, args.steps, mark)
                    if split["marks"] != args.steps:
                        say(f"  {side}: {split['marks']} marks for {args.steps} steps")
                    fwd_only = _fwd_train_busy(item, side, args.steps)
                    for k in ("total", "bwd", "fwd", "lost"):
                        rows[k].append(split[k] / args.steps / 1e3)
                    if fwd_only is not None:
                        rows["derived"].append((split["total"] - fwd_only) / args.steps / 1e3)
            med = {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}
            spread = {k: (max(v) - min(v)) / max(statistics.median(v), 1e-9) if v else float("nan")
                      for k, v in rows.items()}
            say(f"{item.case.id} [{side}] us/step: total {med['total']:.1f}, bwd (linked) {med['bwd']:.1f} "
                f"(spread {spread['bwd']:.1%}), fwd (linked) {med['fwd']:.1f}, unlinked {med['lost']:.1f}; "
                f"derived bwd (total - fwd_train round) {med['derived']:.1f} (spread {spread['derived']:.1%})")
        torch.cuda.empty_cache()


_FWD_STEPS: dict[tuple[str, str], object] = {}


def _fwd_train_busy(item, side: str, n: int) -> float | None:
    """Device ns of ``n`` ``fwd_train`` steps of the same side (the bench's derived figure's subtrahend)."""
    from gradsweep.bench.runner import OpStep

    key = (item.case.id, side)
    if key not in _FWD_STEPS:
        ref = dict(item.refs)[side]
        base = ref.calls[0]
        if not isinstance(base, OpStep):
            return None
        _FWD_STEPS[key] = OpStep(base.op, base.candidate, base.data, base.shape, base.lengths,
                                 [c.pieces for c in base.calls], "fwd_train", base.grads)
    return _round(_FWD_STEPS[key], n, None)["total"]


if __name__ == "__main__":
    main()
