"""Run cells in isolated worker processes, grouped by worker pool, with a per-cell timeout.

Each worker gets its profile's environment before Python imports anything, runs cells one at a
time and streams each result back. Profiles with the same environment and placement share a pool of
workers (``worker_pools``): a worker then walks the cells op by op across those profiles, so an op's
FP64 reference and stock baselines, which do not depend on the profile, are computed once per worker
instead of once per profile (the release sweep's baselines were most of its first cell per op and
profile: ~50 s per profile on the H200). A segfault, abort or hang ends only the cell in flight (as
``error``, naming the signal or the timeout); a fresh worker carries on with the rest. With several
GPUs visible, each worker of a GPU profile holds one GPU (see placement.py). Workers die with the
sweep's parent process, whichever way it ends (see worker.die_with_parent).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gradsweep.resolve import DEFAULT_CELL_FN, DEFAULT_LOADER
from gradsweep.results import CellKey, CellResult, Status
from gradsweep.sweep.placement import VISIBLE, GpuSlots

DEFAULT_TIMEOUT_S = 900.0
MAX_START_FAILURES = 2


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


@dataclass
class RunSpec:
    """What to run: the cells, where workers read the manifest, and how each profile's worker starts."""

    manifest_path: Path
    cells: list[CellKey]
    profile_env: dict[str, dict[str, str]] = field(default_factory=dict)
    cell_fn: str = DEFAULT_CELL_FN
    loader: str = DEFAULT_LOADER
    timeout_s: float = DEFAULT_TIMEOUT_S
    jobs: int = 1
    reruns: int | None = None  # overrides the manifest's reruns in every worker
    allow_plugins: bool = False  # let workers import the manifest's plugin modules
    gpus: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES ids to place workers on
    placed: frozenset[str] = frozenset()  # profiles whose workers each hold one GPU of ``gpus``


def worker_pools(profiles: list[str], profile_env: dict[str, dict[str, str]],
                 placed: frozenset[str]) -> dict[str, str]:
    """profile -> the name of its worker pool: profiles whose workers would start alike (the same environment,
    both placed on a GPU or neither) share workers. A cell names its profile, so a worker serves any of them."""
    members: dict[tuple, list[str]] = {}
    for profile in dict.fromkeys(profiles):
        env = tuple(sorted(profile_env.get(profile, {}).items()))
        members.setdefault((profile in placed, env), []).append(profile)
    return {p: "+".join(group) for group in members.values() for p in group}


@dataclass
class _Worker:
    pool: str
    proc: subprocess.Popen[bytes]
    fd: int
    log: IO[bytes]
    buf: bytes = b""
    current: CellKey | None = None
    deadline: float = 0.0
    started: float = 0.0
    ready: bool = False
    gpu: str | None = None
    last_op: str | None = None


def _error(key: CellKey, reason: str, duration: float = 0.0) -> CellResult:
    return CellResult(key=key, status=Status.ERROR, reason=reason, duration_s=round(duration, 3))


def _log_tail(log: IO[bytes], limit: int = 400) -> str:
    """A dead worker's stderr in brief: faulthandler's fatal line and innermost frames, else last lines."""
    try:
        log.seek(0, os.SEEK_END)
        size = log.tell()
        log.seek(max(0, size - 16384))
        text = log.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    fatal = [i for i, ln in enumerate(lines) if ln.startswith("Fatal Python error")]
    if fatal:
        first = fatal[-1]
        frames = [ln for ln in lines[first:] if ln.startswith("File ")]
        picked = [lines[first], *frames[:2]]
    else:
        picked = lines[-3:]
    return " | ".join(picked)[-limit:]


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "worker vanished"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker killed by {name}"
    return f"worker exited with code {code}"


ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"


def _worker_env(profile_env: dict[str, str], gpu: str | None = None) -> dict[str, str]:
    """The parent's environment, the profile's (allowlisted) variables, and this checkout first on the
    path. The working directory is not added: a sitecustomize.py lying there must not run in a worker.

    Unless the caller or the profile chose otherwise, a worker's CUDA caching allocator grows expandable segments:
    cells of very different sizes run one after another in one worker, and with fixed segments the release chain's
    cells on an 80 GB H100 failed with 15-25 GiB reserved but unallocated (fragmentation, evidence/README.md).
    Where memory lies does not change what a kernel computes."""
    env = dict(os.environ)
    env.update(profile_env)
    env.setdefault(ALLOC_CONF, "expandable_segments:True")
    if gpu is not None:
        env[VISIBLE] = gpu
    repo = str(Path(__file__).resolve().parents[2])
    paths = [repo] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONFAULTHANDLER"] = "1"
    return env


class Runner:
    """Schedules cells onto at most ``jobs`` workers and collects their results."""

    def __init__(self, spec: RunSpec, on_result: Callable[[CellResult], None] | None = None):
        self.spec = spec
        self.on_result = on_result or (lambda _r: None)
        self.pending: dict[str, deque[CellKey]] = {}
        self.pool_of = worker_pools([key.profile for key in spec.cells], spec.profile_env, spec.placed)
        self.pool_env = {pool: spec.profile_env.get(p, {}) for p, pool in self.pool_of.items()}
        self.placed_pools = frozenset(pool for p, pool in self.pool_of.items() if p in spec.placed)
        for key in sorted(spec.cells, key=lambda c: c.id):  # op first: a pool's worker walks an op's cells
            self.pending.setdefault(self.pool_of[key.profile], deque()).append(key)  # across its profiles
        self.workers: dict[int, _Worker] = {}
        self.start_failures: dict[str, int] = {}
        self.results: list[CellResult] = []
        self.sel = selectors.DefaultSelector()
        self.slots = GpuSlots(spec.gpus)

    def run(self) -> list[CellResult]:
        try:
            while self._has_work():
                self._fill_slots()
                self._poll()
        finally:
            for worker in list(self.workers.values()):
                self._kill(worker)
            self.sel.close()
        return self.results

    # scheduling -------------------------------------------------------------------------

    def _has_work(self) -> bool:
        return any(self.pending.values()) or any(w.current for w in self.workers.values())

    def _pick_pool(self) -> str | None:
        """The pool most in need of another worker; an extra worker (each costs a start-up, e.g. a
        torch import) only when its pool has more than two cells queued per running worker. A placed
        pool needs a free GPU; while one waits for a GPU, CPU pools leave the GPUs' share of the
        workers free, so they cannot starve the GPU cells."""
        counts = {p: sum(1 for w in self.workers.values() if w.pool == p) for p in self.pending}
        gpu_free = bool(self.slots.free)
        gpu_waiting = any(q for p, q in self.pending.items() if p in self.placed_pools)
        unplaced_live = sum(1 for w in self.workers.values() if w.pool not in self.placed_pools)
        cpu_room = not gpu_waiting or unplaced_live < max(1, self.spec.jobs - len(self.spec.gpus))
        choices = [p for p, q in self.pending.items() if q and len(q) > 2 * counts[p]
                   and (gpu_free if p in self.placed_pools else cpu_room)]
        if not choices:
            return None
        return max(choices, key=lambda p: (len(self.pending[p]) / (1 + counts[p]), -counts[p]))

    def _fill_slots(self) -> None:
        while len(self.workers) < max(1, self.spec.jobs):
            pool = self._pick_pool()
            if pool is None:
                return
            worker = self._spawn(pool)
            self._assign(worker)

    def _next_key(self, worker: _Worker, queue: deque[CellKey]) -> CellKey:
        """Keep a worker on one op (its cached baselines are per op), and send a second worker of the same
        pool to an op nobody is on, so two workers do not compute the same baselines twice."""
        busy = {w.last_op for w in self.workers.values() if w is not worker and w.pool == worker.pool}
        pick = next((k for k in queue if k.op == worker.last_op), None) \
            or next((k for k in queue if k.op not in busy), None) or queue[0]
        queue.remove(pick)
        return pick

    def _assign(self, worker: _Worker) -> None:
        queue = self.pending.get(worker.pool)
        if not queue:
            self._retire(worker)
            return
        key = self._next_key(worker, queue)
        worker.current = key
        worker.last_op = key.op
        worker.deadline = time.monotonic() + self.spec.timeout_s
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write((json.dumps({"cell": key.id}) + "\n").encode())
            worker.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the worker died; its EOF is handled by _poll

    def _spawn(self, pool: str) -> _Worker:
        gpu = self.slots.acquire() if pool in self.placed_pools else None
        read_fd, write_fd = os.pipe()
        log = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "gradsweep.sweep.worker", "--manifest", str(self.spec.manifest_path),
               "--cell-fn", self.spec.cell_fn, "--loader", self.spec.loader, "--fd", str(write_fd),
               "--parent-pid", str(os.getpid())]
        if self.spec.reruns is not None:
            cmd += ["--reruns", str(self.spec.reruns)]
        if self.spec.allow_plugins:
            cmd.append("--allow-plugins")
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,),
                                env=_worker_env(self.pool_env.get(pool, {}), gpu),
                                start_new_session=True)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        worker = _Worker(pool=pool, proc=proc, fd=read_fd, log=log, gpu=gpu)
        self.workers[read_fd] = worker
        self.sel.register(read_fd, selectors.EVENT_READ, worker)
        return worker

    def _retire(self, worker: _Worker) -> None:
        """No more cells for this worker: close its stdin so it exits cleanly."""
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.close()
        except OSError:
            pass
        try:
            worker.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill(worker)
            return
        self._drop(worker)

    def _kill(self, worker: _Worker) -> None:
        try:
            os.killpg(worker.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        worker.proc.wait()
        self._drop(worker)

    def _drop(self, worker: _Worker) -> None:
        self.slots.release(worker.gpu)
        worker.gpu = None
        if worker.fd in self.workers:
            self.sel.unregister(worker.fd)
            os.close(worker.fd)
            del self.workers[worker.fd]
        if worker.proc.stdin is not None and not worker.proc.stdin.closed:
            try:
                worker.proc.stdin.close()
            except OSError:
                pass
        worker.log.close()

    # events -----------------------------------------------------------------------------

    def _record(self, result: CellResult) -> None:
        self.results.append(result)
        self.on_result(result)

    def _poll(self) -> None:
        if not self.workers:
            return
        now = time.monotonic()
        wait = max(0.0, min(w.deadline for w in self.workers.values()) - now)
        for sel_key, _ in self.sel.select(timeout=min(wait, 0.5)):
            worker: _Worker = sel_key.data
            if worker.fd in self.workers:
                self._read(worker)
        now = time.monotonic()
        for worker in list(self.workers.values()):
            if worker.current is not None and now >= worker.deadline:
                key = worker.current
                worker.current = None
                self._kill(worker)
                self._record(_error(key, f"timeout: no result within {self.spec.timeout_s:g} s "
                                         "(worker killed)", self.spec.timeout_s))

    def _read(self, worker: _Worker) -> None:
        try:
            chunk = os.read(worker.fd, 1 << 16)
        except BlockingIOError:
            return
        if not chunk:
            self._on_exit(worker)
            return
        worker.buf += chunk
        while b"\n" in worker.buf and worker.fd in self.workers:
            line, worker.buf = worker.buf.split(b"\n", 1)
            self._on_message(worker, json.loads(line))

    def _on_message(self, worker: _Worker, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        if event == "ready":
            worker.ready = True
            self.start_failures[worker.pool] = 0
        elif event == "start":
            worker.started = time.monotonic()
            worker.deadline = worker.started + self.spec.timeout_s
        elif event == "result":
            result = CellResult.model_validate(msg["result"])
            if worker.current is None or result.key != worker.current:
                result = _error(worker.current or result.key, f"worker answered for {result.key.id}")
            worker.current = None
            self._record(result)
            self._assign(worker)
        elif event == "fatal":
            self._fail_pool(worker, str(msg.get("message", "worker could not start")))

    def _fail_pool(self, worker: _Worker, reason: str) -> None:
        """The worker cannot start at all: every remaining cell of its pool (its profiles) is an error."""
        doomed = ([worker.current] if worker.current else []) + list(self.pending.get(worker.pool, []))
        self.pending[worker.pool] = deque()
        worker.current = None
        self._kill(worker)
        for key in doomed:
            self._record(_error(key, reason))

    def _on_exit(self, worker: _Worker) -> None:
        code = worker.proc.wait()
        key = worker.current
        if key is None:
            self._drop(worker)
            return
        tail = _log_tail(worker.log)
        reason = _exit_reason(code) + (f"; stderr: {tail}" if tail else "")
        if not worker.ready:
            self.start_failures[worker.pool] = self.start_failures.get(worker.pool, 0) + 1
            if self.start_failures[worker.pool] >= MAX_START_FAILURES:
                self._fail_pool(worker, f"worker could not start: {reason}")
                return
            # retry the cell in a fresh worker: it never started, so it has not crashed anything yet
            self.pending[worker.pool].appendleft(key)
            worker.current = None
            self._drop(worker)
            return
        worker.current = None
        self._drop(worker)
        self._record(_error(key, reason, time.monotonic() - worker.started))


def run_cells(spec: RunSpec, on_result: Callable[[CellResult], None] | None = None) -> list[CellResult]:
    """Run every cell of ``spec`` isolated; results arrive via ``on_result`` as they finish."""
    return Runner(spec, on_result).run()
