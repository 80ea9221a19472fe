"""Fake cell functions for sweep tests.

``cell`` acts on the manifest's ``behaviour`` for the cell: green, red, no_backward, blocked,
skipped, raise, segfault, abort, hang, exit, wrong_type. It first appends the cell id to the file
named by $FAKE_CALL_LOG (so tests can count calls), with its pid, CUDA_VISIBLE_DEVICES and the manifest's
reruns when $FAKE_CALL_DETAIL is set, and checks the worker got its profile's env.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Any

from gradsweep.results import CellKey, CellResult, Status, TensorMetrics

_STATUS = {"green": Status.GREEN, "red": Status.RED_VERDICT, "no_backward": Status.RED_NO_BACKWARD,
           "blocked": Status.BLOCKED_HARDWARE, "skipped": Status.SKIPPED}


def _log_call(key: CellKey, manifest: Any) -> None:
    path = os.environ.get("FAKE_CALL_LOG")
    if path:
        detail = ""
        if os.environ.get("FAKE_CALL_DETAIL"):
            gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "-")
            detail = f" pid={os.getpid()} gpu={gpu} reruns={getattr(manifest, 'reruns', None)}"
        with open(path, "a") as fh:
            fh.write(key.id + detail + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def _accuracy_error(key: CellKey) -> float:
    """The recorded error of the cell's tensor: 1e-3, or what $FAKE_ACCURACY_ERROR ("op:value,...") gives its op
    (a moved output, for tests that compare evidence files)."""
    planted = dict(item.split(":") for item in os.environ.get("FAKE_ACCURACY_ERROR", "").split(",") if item)
    return float(planted.get(key.op, 1e-3))


def cell(manifest: Any, key: CellKey) -> Any:
    _log_call(key, manifest)
    if os.environ.get("GRADSWEEP_FAKE_PROFILE") not in (None, key.profile):
        return CellResult(key=key, status=Status.ERROR, reason="worker env is another profile's")
    what = manifest.behaviour_of(key)
    if os.environ.get("FAKE_SLEEP"):
        time.sleep(float(os.environ["FAKE_SLEEP"]))
    if what == "raise":
        raise RuntimeError(f"planted failure in {key.id}")
    if what == "segfault":
        ctypes.string_at(0)
    if what == "abort":
        os.kill(os.getpid(), signal.SIGABRT)
    if what == "hang":
        time.sleep(3600)
    if what == "exit":
        os._exit(7)
    if what == "wrong_type":
        return {"status": "green"}
    metric = TensorMetrics(name="dx", kind="gradient", invariance_check="bn_full vs " + key.layout,
                           bitwise_equal=what != "red", mismatched_elements=3 if what == "red" else 0,
                           max_abs=float("inf") if what == "red" else 0.0, max_rel=float("nan"),
                           accuracy_error=_accuracy_error(key))
    return CellResult(key=key, status=_STATUS[what], reason="" if what == "green" else f"planted {what}",
                      candidate="fake", first_failure="dx: bitwise" if what == "red" else None,
                      tensors=[metric], shape={"T": 8})


def broken_import(manifest: Any, key: CellKey) -> Any:  # pragma: no cover - never reached
    raise AssertionError


def not_callable_module() -> None:
    raise ImportError("planted import failure")
