"""A sweep worker: one process, one profile, cells run one after another.

Started by the runner with the profile's environment already set (before any import), it loads
the manifest itself, then reads ``{"cell": id}`` lines on stdin and answers on a dedicated pipe
(so a cell printing to stdout cannot corrupt the protocol): ``ready``, ``start``, ``result``,
or ``fatal`` when it cannot even start. A crash or hang is the runner's business.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import traceback
from typing import Any, BinaryIO

from gradsweep.evidence.jsonsafe import jsonable
from gradsweep.results import CellKey, CellResult, Status
from gradsweep.sweep.resolve import resolve


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


def run_one(fn: Any, manifest: Any, key: CellKey) -> CellResult:
    """Call the cell function; an exception or a malformed return value becomes ``error``."""
    started = time.monotonic()
    try:
        result = fn(manifest, key)
        if not isinstance(result, CellResult):
            raise TypeError(f"cell function returned {type(result).__name__}, not CellResult")
        if result.key != key:
            raise ValueError(f"cell function returned a result for {result.key.id}, asked for {key.id}")
    except Exception as exc:  # isolation is the point: any failure is this cell's error
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
    args = parser.parse_args(argv)
    faulthandler.enable(file=sys.stderr)
    out = os.fdopen(args.fd, "wb", buffering=0)
    try:
        manifest = resolve(args.loader)(args.manifest)
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
