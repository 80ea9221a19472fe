"""Workers: one per visible GPU (each pinned to one device), and none outlives the sweep.

Issue 9: `sweep` places workers on every visible GPU; `kill -9` of the sweep parent while a cell hangs
leaves both workers orphaned and running. The GPU count is injected: no GPU is needed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from gradsweep.evidence.signing import write_keypair
from gradsweep.sweep import runner as runner_mod
from gradsweep.sweep.api import SweepOptions, execute_sweep, prepare_sweep
from gradsweep.sweep.placement import GpuSlots, placed_profiles, visible_gpus
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest


@pytest.mark.parametrize(("env", "count", "expect"), [
    ({}, 2, ["0", "1"]),
    ({}, 0, []),
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 2, ["2", "3"]),
    ({"CUDA_VISIBLE_DEVICES": " 4, 6 ,"}, 2, ["4", "6"]),
    ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, 1, ["0"]),
    ({"CUDA_VISIBLE_DEVICES": ""}, 0, []),
    ({"CUDA_VISIBLE_DEVICES": "GPU-a1,GPU-b2"}, 2, ["GPU-a1", "GPU-b2"]),
])
def test_visible_gpus(env: dict[str, str], count: int, expect: list[str]) -> None:
    assert visible_gpus(env, count) == expect


def test_which_profiles_are_placed() -> None:
    devices = {"gpu": "cuda", "auto": "auto", "cpu": "cpu", "pinned": "cuda"}
    envs = {"pinned": {"CUDA_VISIBLE_DEVICES": "1"}}
    assert placed_profiles(devices, envs, ["0", "1"]) == {"gpu", "auto"}
    assert placed_profiles(devices, envs, ["0"]) == {"gpu", "auto"}  # one GPU is not shared either
    assert placed_profiles(devices, envs, []) == frozenset()
    slots = GpuSlots(["0", "1"])
    assert [slots.acquire(), slots.acquire(), slots.acquire()] == ["0", "1", None]
    slots.release("0")
    assert slots.acquire() == "0"


def _gpu_manifest(tmp_path: Path) -> Path:
    import yaml

    path = write_manifest(tmp_path, ops=("a", "b", "c"), profiles=("g1", "g2", "cpu"))
    data = yaml.safe_load(path.read_text())
    data["profiles"]["g1"]["device"] = "cuda"
    data["profiles"]["g2"]["device"] = "auto"
    path.write_text(yaml.safe_dump(data))
    return path


def test_one_worker_per_gpu_each_cell_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_CALL_LOG", str(log))
    monkeypatch.setenv("FAKE_CALL_DETAIL", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    key = tmp_path / "k.pem"
    write_keypair(key)
    live: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    spawn, drop = runner_mod.Runner._spawn, runner_mod.Runner._drop

    def counting_spawn(self, profile):  # type: ignore[no-untyped-def]
        worker = spawn(self, profile)
        if worker.gpu is not None:
            live[worker.gpu] += 1
            peak[worker.gpu] = max(peak[worker.gpu], live[worker.gpu])
        return worker

    def counting_drop(self, worker):  # type: ignore[no-untyped-def]
        if worker.gpu is not None:
            live[worker.gpu] -= 1
        drop(self, worker)

    monkeypatch.setattr(runner_mod.Runner, "_spawn", counting_spawn)
    monkeypatch.setattr(runner_mod.Runner, "_drop", counting_drop)
    opts = SweepOptions(manifest=_gpu_manifest(tmp_path), out=tmp_path / "ev.json", key=key, cell_fn=FAKE_CELL,
                        loader=FAKE_LOADER, gpus=["3", "5"], jobs=3)
    plan = prepare_sweep(opts, lambda _m: None)
    assert plan.placed == {"g1", "g2"}
    outcome = execute_sweep(plan)
    assert outcome.exit_code == 0
    by_pid: dict[str, set[str]] = defaultdict(set)
    gpus_of: dict[str, set[str]] = defaultdict(set)
    for line in log.read_text().splitlines():
        cell, pid, gpu, _ = line.split()
        by_pid[pid].add(gpu.removeprefix("gpu="))
        gpus_of[cell.split("/")[1]].add(gpu.removeprefix("gpu="))
    assert all(len(g) == 1 for g in by_pid.values()), "a worker saw more than one device"
    assert gpus_of["g1"] | gpus_of["g2"] == {"3", "5"} and gpus_of["cpu"] == {"-"}
    assert set(peak) == {"3", "5"} and max(peak.values()) == 1, "two live workers shared a GPU"
    plan_default = prepare_sweep(SweepOptions(manifest=opts.manifest, out=tmp_path / "ev2.json", key=key,
                                              cell_fn=FAKE_CELL, loader=FAKE_LOADER, gpus=["0", "1", "2", "3"]),
                                 lambda _m: None)
    assert plan_default.jobs == 4 + runner_mod.default_jobs()  # one worker per GPU, CPU workers beside them
    single = prepare_sweep(SweepOptions(manifest=opts.manifest, out=tmp_path / "ev3.json", key=key,
                                        cell_fn=FAKE_CELL, loader=FAKE_LOADER, gpus=["0"]), lambda _m: None)
    assert single.placed == {"g1", "g2"} and single.jobs == 1 + runner_mod.default_jobs()
    gpu_only = prepare_sweep(SweepOptions(manifest=opts.manifest, out=tmp_path / "ev4.json", key=key,
                                          cell_fn=FAKE_CELL, loader=FAKE_LOADER, gpus=["0"], profiles=["g1", "g2"]),
                             lambda _m: None)
    assert gpu_only.jobs == 1  # a one-GPU box runs its GPU profiles one after another


def test_a_one_gpu_box_never_runs_two_gpu_workers_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two release-shape chain cells on one H200 ran it out of memory (2026-11-30): by default, and even with
    more jobs asked for, at most one worker holds the one GPU; the CPU profile runs beside it."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    key = tmp_path / "k.pem"
    write_keypair(key)
    live = {"gpu": 0, "cpu": 0}
    peak = {"gpu": 0, "cpu": 0}
    spawn, drop = runner_mod.Runner._spawn, runner_mod.Runner._drop

    def counting_spawn(self, profile):  # type: ignore[no-untyped-def]
        worker = spawn(self, profile)
        kind = "gpu" if worker.gpu is not None else "cpu"
        live[kind] += 1
        peak[kind] = max(peak[kind], live[kind])
        return worker

    def counting_drop(self, worker):  # type: ignore[no-untyped-def]
        live["gpu" if worker.gpu is not None else "cpu"] -= 1
        drop(self, worker)

    monkeypatch.setattr(runner_mod.Runner, "_spawn", counting_spawn)
    monkeypatch.setattr(runner_mod.Runner, "_drop", counting_drop)
    for jobs in (None, 4):
        peak.update(gpu=0, cpu=0)
        opts = SweepOptions(manifest=_gpu_manifest(tmp_path), out=tmp_path / f"ev{jobs}.json", key=key,
                            cell_fn=FAKE_CELL, loader=FAKE_LOADER, gpus=["0"], jobs=jobs)
        plan = prepare_sweep(opts, lambda _m: None)
        assert execute_sweep(plan).exit_code == 0
        assert peak["gpu"] == 1, f"jobs={jobs}: two workers shared the one GPU"
        assert peak["cpu"] >= 1


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    write_keypair(key)
    log = tmp_path / "calls.log"
    manifest = write_manifest(tmp_path, {"*": "hang"})
    env = {**os.environ, "FAKE_CALL_LOG": str(log), "FAKE_CALL_DETAIL": "1", "PYTHONPATH": str(REPO),
           "GRADSWEEP_CELL_FN": FAKE_CELL, "GRADSWEEP_MANIFEST_LOADER": FAKE_LOADER}
    parent = subprocess.Popen([sys.executable, "-m", "gradsweep.cli", "sweep", str(manifest), "-o",
                               str(tmp_path / "ev.json"), "--key", str(key), "-j", "2", "--no-progress"],
                              env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pids: set[int] = set()
    deadline = time.monotonic() + 120
    while len(pids) < 2 and time.monotonic() < deadline:
        if log.exists():
            pids = {int(line.split()[1].removeprefix("pid=")) for line in log.read_text().splitlines()}
        time.sleep(0.1)
    try:
        assert len(pids) == 2, "both workers should be running a hanging cell"
        assert not any(_dead(p) for p in pids)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while not all(_dead(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert all(_dead(p) for p in pids), "a worker outlived its killed parent"
    finally:
        for pid in pids:  # never leave a hanging worker behind, whatever happened
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
