"""The backward's device time inside one profiled training step, by launch correlation: a diagnostic for the
bench's derived ``bwd`` kernels-only figure (a difference of two profiled rounds, which moves ~10% between runs).

For each selected bench case (the steps ``gradsweep bench`` times, scripts/probe_cases.py) and each side, the
``fwd_bwd`` step runs ``--steps`` times under torch's profiler inside ``backward_mark.marking()``, so the step
marks its own backward (and its folds' finish) as the bench's profiled rounds do. The split is the bench's own
``backward_mark.backward_spans``: every device event is linked to the runtime or driver call that launched it (the
two share ``correlation_id``) and belongs to the backward when that call started inside a mark. It prints per step:
device busy time in all, in the backward, in the forward, how many rounds gave no split (an unlinked device event
or a missing mark), and the bench's old derived figure (the same step's busy time minus a profiled ``fwd_train``
round's). Exits 1 when a round gave no split (the bench would then record no direct figure): the merge gate of
``backward_mark``.

    PYTHONPATH=. python3 scripts/bwd_window_probe.py OUT --op det_gemm --case dw_t
"""

from __future__ import annotations

import contextlib
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.bench import backward_mark
from gradsweep.bench.timing import device_activity, merged_busy_ns
from scripts.probe_cases import log_to, probe_parser, training_steps


def _kineto_events(prof) -> list:
    return list(prof.profiler.kineto_results.events())


def _is_work(e) -> bool:
    return device_activity(e.name(), False)


def split_busy(prof) -> dict[str, float | None]:
    """Device ns in all / in the backward / in the forward and the marks drawn, from one profiled round (the
    bench's own ``backward_spans``); ``bwd`` and ``fwd`` are None when a device event could not be linked to its
    launch (no split)."""
    events = _kineto_events(prof)
    total = merged_busy_ns([(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
                            if backward_mark.is_device(e) and e.name() != backward_mark.MARK and _is_work(e)])
    linked = backward_mark.backward_spans(events, _is_work)
    if linked is None:
        return {"total": total, "bwd": None, "fwd": None, "marks": None}
    marks, spans = linked
    bwd = merged_busy_ns(spans)
    return {"total": total, "bwd": bwd, "fwd": total - bwd, "marks": marks}


def _round(step, n: int, marked: bool) -> dict[str, float | None]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with backward_mark.marking() if marked else contextlib.nullcontext():
            for _ in range(n):
                step()
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
    unsplit = 0
    for item in training_steps(args.manifest, args.op, args.case, device, say):
        for side, ref in item.refs:
            step = ref.calls[0]
            rows: dict[str, list[float]] = {"total": [], "bwd": [], "fwd": [], "derived": []}
            with ref.context():
                for _ in range(args.rounds):
                    split = _round(step, args.steps, True)
                    if split["bwd"] is None or split["marks"] != args.steps:
                        unsplit += 1
                        why = ("a device event not linked to its launch" if split["bwd"] is None
                               else f"{split['marks']} marks for {args.steps} steps")
                        say(f"  {side}: no split: {why}")
                        continue
                    for k in ("total", "bwd", "fwd"):
                        rows[k].append(split[k] / args.steps / 1e3)
                    fwd_only = _fwd_train_busy(item, side, args.steps)
                    if fwd_only is not None:
                        rows["derived"].append((split["total"] - fwd_only) / args.steps / 1e3)
            med = {k: statistics.median(v) if v else float("nan") for k, v in rows.items()}
            spread = {k: (max(v) - min(v)) / max(statistics.median(v), 1e-9) if v else float("nan")
                      for k, v in rows.items()}
            say(f"{item.case.id} [{side}] us/step: total {med['total']:.1f}, bwd (linked) {med['bwd']:.1f} "
                f"(spread {spread['bwd']:.1%}), fwd (linked) {med['fwd']:.1f}, "
                f"rounds unsplit {args.rounds - len(rows['bwd'])}; "
                f"derived bwd (total - fwd_train round) {med['derived']:.1f} (spread {spread['derived']:.1%})")
        torch.cuda.empty_cache()
    if unsplit:
        raise SystemExit(f"{unsplit} rounds gave no backward split (a missing mark or an unlinked launch)")

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
    return _round(_FWD_STEPS[key], n, False)["total"]


if __name__ == "__main__":
    main()
