"""A sweep worker: one process, one profile, cells run one after another.

Started by the runner with the profile's environment already set (before any import), it loads
the manifest itself, then reads ``{"cell": id}`` lines on stdin and answers on a dedicated pipe
(so a cell printing to stdout cannot corrupt the protocol): ``ready``, ``start``, ``result``,
or ``fatal`` when it cannot even start. A crash or hang is the runner's business.

A worker never outlives the sweep: it asks the kernel for SIGKILL when its parent dies (Linux
PR_SET_PDEATHSIG) and a watchdog thread kills its process group when the parent is gone (elsewhere,
or if the signal was missed), so even ``kill -9`` of the sweep leaves no worker running.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import fields, is_dataclass, replace
from typing import Any, BinaryIO

from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.resolve import resolve
from gradsweep.results import CellKey, CellResult, Status


def _send(out: BinaryIO, event: str, **fields: Any) -> None:
    out.write((json.dumps(jsonable({"event": event, **fields}), allow_nan=False) + "\n").encode())
    out.flush()


def describe_exception(exc: BaseException) -> str:
    """'Type: message (at file:line in func)', the innermost frame, on one line."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" \
        if frames else ""
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message}{where}"


PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.5


def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(WATCH_INTERVAL_S)
        if os.getppid() != parent:
            try:
                os.killpg(os.getpgrp(), signal.SIGKILL)  # the worker leads its own group: it and its children
            finally:
                os._exit(1)


def die_with_parent(parent: int) -> None:
    """Make this process (and its process group) die when ``parent`` does, however it dies."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):
            pass  # the watchdog below still applies
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    threading.Thread(target=_watch_parent, args=(parent,), name="parent-watch", daemon=True).start()


def with_reruns(manifest: Any, reruns: int | None) -> Any:
    """The manifest with ``reruns`` overridden (--reruns); pydantic models and dataclass fakes alike."""
    if reruns is None:
        return manifest
    if hasattr(manifest, "model_copy"):
        return manifest.model_copy(update={"reruns": reruns})
    if is_dataclass(manifest) and any(f.name == "reruns" for f in fields(manifest)):
        return replace(manifest, reruns=reruns)
    raise TypeError(f"{type(manifest).__name__} has no 'reruns' to override")


def load_with(loader: Any, path: str, allow_plugins: bool) -> Any:
    """Call a manifest loader; plugins are imported only when allowed."""
    return loader(path, allow_plugins=allow_plugins)


def run_one(fn: Any, manifest: Any, key: CellKey, show_traceback: bool = True) -> CellResult:
    """Call the cell function; an exception or a malformed return value becomes ``error``.

    The traceback goes to stderr (a worker's log, whose tail names the crash) unless ``show_traceback``
    is off (``check`` in the user's terminal: the reason already names the innermost frame).
    """
    started = time.monotonic()
    try:
        result = fn(manifest, key)
        if not isinstance(result, CellResult):
            raise TypeError(f"cell function returned {type(result).__name__}, not CellResult")
        if result.key != key:
            raise ValueError(f"cell function returned a result for {result.key.id}, asked for {key.id}")
    except Exception as exc:  # isolation is the point: any failure is this cell's error
        if show_traceback:
            traceback.print_exc(file=sys.stderr)
        result = CellResult(key=key, status=Status.ERROR, reason=describe_exception(exc))
    if not result.duration_s:
        result = result.model_copy(update={"duration_s": round(time.monotonic() - started, 6)})
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gradsweep-worker")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--cell-fn", required=True)
    parser.add_argument("--loader", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--reruns", type=int, default=None)
    parser.add_argument("--allow-plugins", action="store_true")
    args = parser.parse_args(argv)
    if args.parent_pid is not None:
        die_with_parent(args.parent_pid)
    faulthandler.enable(file=sys.stderr)
    out = os.fdopen(args.fd, "wb", buffering=0)
    try:
        manifest = with_reruns(load_with(resolve(args.loader), args.manifest, args.allow_plugins), args.reruns)
        fn = resolve(args.cell_fn)
    except BaseException as exc:  # reported to the runner, which marks the cells
        traceback.print_exc(file=sys.stderr)
        _send(out, "fatal", message=f"worker could not start: {describe_exception(exc)}")
        return 1
    _send(out, "ready", pid=os.getpid())
    for line in sys.stdin:
        msg = json.loads(line)
        if "cell" not in msg:
            break
        key = CellKey.parse(msg["cell"])
        _send(out, "start", cell=key.id)
        result = run_one(fn, manifest, key)
        _send(out, "result", result=result.model_dump(mode="python"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
