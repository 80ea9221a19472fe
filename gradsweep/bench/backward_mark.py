"""The backward of a timed training step, marked on the host so its device time can be read inside one step.

A ``bwd`` case's kernels-only figure used to be the difference of two separately profiled rounds (the training step
minus its forward), which moved ~10% between runs. A step that runs its backward inside ``backward_section()``
lets the profiler's trace say which device work the backward launched: every device event shares its
``correlation_id`` with the runtime or driver call that launched it (cudaLaunchKernel, cuLaunchKernelEx, ...), and a
launch that started inside the mark's host range belongs to the backward, whatever thread ran it (checked on torch
2.11 on an H100: every kernel of the stock, Triton and CUDA C++ dW steps linked;
bench/results/bwd_window_2026-12-06_h100/).

The mark is drawn only while ``marking()`` is on (the profiled kernels-only rounds), so the end-to-end samples pay
nothing for it.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Sequence

MARK = "gradsweep::backward"
# a CUDA runtime or driver call (cudaLaunchKernel, cuLaunchKernelEx, cudaMemsetAsync): a torch op's own id lives in
# another id space, and an op such as cudnn_convolution must not be taken for a launch
_RUNTIME_CALL = re.compile(r"cu(da)?[A-Z]")
_ACTIVE = False


@contextlib.contextmanager
def marking() -> Iterator[None]:
    """Steps run inside this draw their backward mark (a profiled round)."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, True
    try:
        yield
    finally:
        _ACTIVE = before


def backward_section() -> contextlib.AbstractContextManager[object]:
    """The context a step runs its backward (and its folds' finish) in: the mark while ``marking()`` is on."""
    if not _ACTIVE:
        return contextlib.nullcontext()
    from torch.profiler import record_function

    return record_function(MARK)


def is_device(event) -> bool:
    return str(event.device_type()).rsplit(".", 1)[-1] in ("CUDA", "PrivateUse1")


def backward_spans(events: Sequence, is_work) -> tuple[int, list[tuple[int, int]]] | None:
    """(marks, [start, end) ns of every device work event launched inside a mark) from a trace's raw kineto events;
    None when a device work event cannot be linked to the call that launched it (the figure would be short).

    ``is_work(event)`` says whether a device event is work (kernel, copy, memset), as the total busy time counts it.
    """
    marks = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in events if e.name() == MARK and not is_device(e)]
    launches = {e.correlation_id(): e.start_ns() for e in events
                if not is_device(e) and e.correlation_id() > 0 and _RUNTIME_CALL.match(e.name())}
    spans = []
    for e in events:
        if not is_device(e) or e.name() == MARK or not is_work(e):  # the mark's own device-side range is no work
            continue
        start = launches.get(e.correlation_id())
        if start is None:
            return None
        if any(a <= start <= b for a, b in marks):
            spans.append((e.start_ns(), e.start_ns() + e.duration_ns()))
    return len(marks), spans
