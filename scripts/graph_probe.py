"""Which bench steps a CUDA graph can capture and replay with the eager step's bits: a diagnostic for issue 11
("launches that can be captured in a CUDA graph"), not a benchmark and not evidence.

For each bench case of the chosen ops (the steps ``gradsweep bench`` times, at their shapes and layouts), every
family's step and the stock step: two eager warm-up steps (plans, caches, compilation), an eager step whose
outputs and gradients are kept, then one step captured in a ``torch.cuda.CUDAGraph`` and replayed twice (the main
grads zeroed before each replay, outside the graph); the replay's outputs and gradients are compared with the
eager ones bit for bit (``bench.checks.compare_logical``, the bench's timed-data check). It prints, per step:
captured or the exception that stopped the capture, the tensors that differ after replay, and the replay's time
per step against the eager step's (CUDA events, no host work in a replay: what a server's captured decode step or
a captured training step pays).

    PYTHONPATH=. python3 scripts/graph_probe.py OUT --op det_gemm --case fwd_m1 --case fwd_m16 --op attention

A capture fails where a step reads device data back to the host (a sync), uploads through pageable memory, or
allocates what the capture cannot; a replay differs where a captured upload's pinned host buffer or a plan
cached on the host changed after the capture. Neither is a verdict on a kernel's bits: the sweep's evidence is.
"""

from __future__ import annotations

import time

import torch

from gradsweep.bench.checks import compare_logical
from gradsweep.bench.runner import OpStep
from scripts.probe_cases import case_steps, probe_parser


def per_step_ms(fn, n: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / n


def probe(step: OpStep) -> str:
    """One line: capture, replay bits, replay and eager time per step."""
    for _ in range(2):
        step()
    eager = step.collect()
    eager_ms = per_step_ms(step)
    graph = torch.cuda.CUDAGraph()
    step.zero_main_grads()
    torch.cuda.synchronize()
    try:
        with torch.cuda.graph(graph):
            last = step.record()
    except Exception as exc:  # what stopped the capture is the finding
        torch.cuda.synchronize()
        return f"capture failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    step.last = None
    diffs: list[str] = []
    for _ in range(2):
        step.zero_main_grads()
        graph.replay()
        torch.cuda.synchronize()
        diffs = compare_logical(eager, step.gathered(last))  # the bench's own raw-bit check ("split run": replay)
        if diffs:
            break

    def replay() -> None:
        step.zero_main_grads()
        graph.replay()
    replay_ms = per_step_ms(replay)
    state = "replay == eager bitwise" if not diffs else f"replay DIFFERS: {'; '.join(diffs[:6])}"
    return f"captured; {state}; replay {replay_ms:.3f} ms vs eager {eager_ms:.3f} ms per step"


def main() -> None:
    args = probe_parser(__doc__.splitlines()[0]).parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "graph_probe.txt").open("a")
    device = torch.device("cuda")
    t0 = time.perf_counter()
    for found in case_steps(args.manifest, args.op, args.case, device):
        if isinstance(found, tuple):
            lines = [f"{found[0].id}: subject failed: {type(found[1]).__name__}: {found[1]}"]
        else:
            lines = [f"{found.case.id} [{name}] {found.mode}: {_probe_ref(ref)}" for name, ref in found.refs]
        for line in [*lines, f"  ({time.perf_counter() - t0:.0f} s)"]:
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()
        t0 = time.perf_counter()


def _probe_ref(ref) -> str:
    step = ref.calls[0]
    if not isinstance(step, OpStep):
        return "not an op step (custom runner): not probed"
    with ref.context():
        try:
            return probe(step)
        except Exception as exc:  # reported, and the probe goes on
            return f"error {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


if __name__ == "__main__":
    main()
