"""scripts/stall_probe.py's wrapping on the CPU (the probe itself needs a GPU): a named function is wrapped in place
with a wall-clock accumulator and still returns what it returned; a name that does not resolve is reported, not
raised."""

from __future__ import annotations

import time

import numpy as np
import torch

from gradsweep import uploads
from scripts import stall_probe


def test_a_wrapped_function_is_timed_and_unchanged(monkeypatch) -> None:
    monkeypatch.setattr(uploads, "upload", uploads.upload)  # restored after the test
    real = uploads.upload

    def slow(*args, **kwargs):
        time.sleep(0.002)
        return real(*args, **kwargs)

    monkeypatch.setattr(uploads, "upload", slow)
    acc = stall_probe.Accumulators()
    assert stall_probe.install("gradsweep.uploads:upload", acc) is None
    got = uploads.upload(np.arange(3), torch.device("cpu"))
    assert torch.equal(got, torch.arange(3))
    assert acc.calls["gradsweep.uploads:upload"] == 1 and acc.seconds["gradsweep.uploads:upload"] >= 0.002
    acc.reset()
    assert not acc.calls


def test_an_unknown_name_is_reported() -> None:
    acc = stall_probe.Accumulators()
    assert "nowhere" in stall_probe.install("gradsweep.uploads:nowhere", acc)
    assert "No module" in stall_probe.install("gradsweep.no_such_module:f", acc)
