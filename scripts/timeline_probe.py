"""Where a bench step's device time goes between kernels, on a GPU box: a diagnostic (not a benchmark).

For each selected bench case (the steps ``gradsweep bench`` times, built by scripts/probe_cases.py), every side
(each family and stock) runs ``--steps`` steps back to back without synchronisation, as the end-to-end clock
does, under torch's profiler. From the trace it prints, per side: the wall span per step, the device busy time
per step (kernels, copies and memsets merged), the idle time between them, the largest idle gaps with the
device activity that ends and the one that starts each gap, and the device time per kernel name. A step whose
end-to-end time exceeds its kernels-only time either leaves the device idle (gaps here) or runs its kernels
slower under sustained load than in the bench's short profiled round: ``--sustain SECONDS`` also samples the
SM clock and power (nvidia-smi) while the step runs back to back for that long, and prints the end-to-end time
per step then.

    PYTHONPATH=. python3 scripts/timeline_probe.py OUT --op det_gemm --case dw_t --sustain 3
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.bench.timing import device_activity
from scripts.host_probe import rotate
from scripts.probe_cases import back_to_back, case_steps, log_to, probe_parser


def device_events(prof) -> list[tuple[float, float, str]]:
    """(start us, end us, name) of every device work event in the trace (the bench's own test,
    ``device_activity``: kernels, copies, memsets; no annotation ranges), by start."""
    out = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA or e.time_range.end <= e.time_range.start:
            continue
        if device_activity(e.name, bool(getattr(e, "is_user_annotation", False))):
            out.append((float(e.time_range.start), float(e.time_range.end), e.name))
    return sorted(out)


def gaps(events: list[tuple[float, float, str]]) -> tuple[float, float, list[tuple[float, str, str]]]:
    """(busy us, span us, [(gap us, activity before, activity after)]) of merged device intervals: the span runs
    from the first start to the latest end, and whatever of it no gap holds is busy."""
    gap_list = []
    cur_e, last = events[0][1], events[0][2]
    for s, e, name in events[1:]:
        if s > cur_e:
            gap_list.append((s - cur_e, last, name))
        if e >= cur_e:
            cur_e, last = e, name
    span = cur_e - events[0][0]
    return span - sum(g for g, _, _ in gap_list), span, gap_list


def trace_side(step, steps: int) -> list[str]:
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        issue = (time.perf_counter() - t0) / steps * 1e3
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps * 1e3
    events = device_events(prof)
    if not events:
        return ["    no device activity"]
    busy, span, gap_list = gaps(events)
    per_kernel: dict[str, float] = defaultdict(float)
    for s, e, name in events:
        per_kernel[name] += e - s
    lines = [f"    issue {issue:.3f} ms/step, wall (profiled) {wall:.3f} ms/step; device span {span / steps / 1e3:.3f}"
             f" ms/step, busy {busy / steps / 1e3:.3f}, idle {(span - busy) / steps / 1e3:.3f} "
             f"({len(gap_list)} gaps)"]
    for g, before, after in sorted(gap_list, reverse=True)[:8]:
        lines.append(f"      gap {g:8.1f} us  after {before[:60]!r}  before {after[:60]!r}")
    for name, t in sorted(per_kernel.items(), key=lambda kv: -kv[1])[:8]:
        lines.append(f"      {t / steps:9.1f} us/step  {name[:100]}")
    return lines


def smi() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception as exc:  # the probe reports what it could not read
        return f"nvidia-smi: {exc!r}"


def sustain(step, seconds: float) -> list[str]:
    """Step back to back for ``seconds`` (one event pair per 20 steps); nvidia-smi sampled meanwhile."""
    samples: list[str] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(smi())
            stop.wait(0.25)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    per_step = [us / 1e3 for us in back_to_back(step, seconds)]
    stop.set()
    thread.join()
    quarter = max(1, len(per_step) // 4)
    first, last, every = (statistics.median(v) for v in (per_step[:quarter], per_step[-quarter:], per_step))
    return [f"    sustained {seconds:.0f} s: {len(per_step)} x 20 steps, ms/step first quarter {first:.3f}, "
            f"last quarter {last:.3f}, all {every:.3f}",
            f"    nvidia-smi (clock, power, temp): {samples[:2]} ... {samples[-2:]}"]


def main() -> None:
    ap = probe_parser(__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sustain", type=float, default=0.0, help="seconds of back-to-back steps with clock samples")
    args = ap.parse_args()
    say = log_to(args.out, "timeline_probe.txt")

    say(f"idle device: {smi()}")
    for found in case_steps(args.manifest, args.op, args.case, torch.device("cuda")):
        if isinstance(found, tuple):
            say(f"{found[0].id}: could not build: {found[1]!r}")
            continue
        for name, ref in found.refs:
            say(f"{found.case.id} {found.mode} [{name}]")
            with ref.context():
                step = rotate(ref.calls)
                for line in trace_side(step, args.steps):
                    say(line)
                if args.sustain:
                    for line in sustain(step, args.sustain):
                        say(line)


if __name__ == "__main__":
    main()
