"""Isolation: a crashing, aborting, hanging or raising cell ends as error; the others complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradsweep.results import CellKey, Status
from gradsweep.sweep.manifest_info import load_info
from gradsweep.sweep.runner import RunSpec, run_cells
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, write_manifest


def _run(manifest: Path, timeout: float = 30.0, jobs: int = 2, cell_fn: str = FAKE_CELL) -> dict[str, object]:
    info = load_info(manifest, FAKE_LOADER)
    spec = RunSpec(manifest_path=info.path, cells=info.cells, profile_env=info.profile_env, cell_fn=cell_fn,
                   loader=FAKE_LOADER, timeout_s=timeout, jobs=jobs)
    streamed: list = []
    results = run_cells(spec, streamed.append)
    assert streamed == results
    by_id = {r.key.id: r for r in results}
    assert sorted(by_id) == sorted(c.id for c in info.cells), "every cell gets exactly one result"
    return by_id


def test_crashes_are_isolated(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a/p1/x": "segfault", "a/p1/y": "abort", "b/p1/x": "raise",
                                         "b/p2/x": "exit", "b/p2/y": "wrong_type", "a/p2/y": "red"},
                              ops=("a", "b", "c"))
    res = _run(manifest)
    assert res["a/p1/x"].status is Status.ERROR and "SIGSEGV" in res["a/p1/x"].reason
    assert "Segmentation fault" in res["a/p1/x"].reason
    assert res["a/p1/y"].status is Status.ERROR and "SIGABRT" in res["a/p1/y"].reason
    assert res["b/p1/x"].status is Status.ERROR
    assert res["b/p1/x"].reason.startswith("RuntimeError: planted failure in b/p1/x")
    assert res["b/p2/x"].status is Status.ERROR and "exited with code 7" in res["b/p2/x"].reason
    assert res["b/p2/y"].status is Status.ERROR and "not CellResult" in res["b/p2/y"].reason
    assert res["a/p2/y"].status is Status.RED_VERDICT
    planted = {"a/p1/x", "a/p1/y", "b/p1/x", "b/p2/x", "b/p2/y", "a/p2/y"}
    others = [r for cid, r in res.items() if cid not in planted]
    assert len(others) == 6 and all(r.status is Status.GREEN for r in others), others
    # metrics survive the trip through the pipe, non-finite floats included
    red = res["a/p2/y"].tensors[0]
    assert red.max_abs == float("inf") and red.max_rel != red.max_rel


def test_hang_times_out_and_sweep_goes_on(tmp_path: Path) -> None:
    manifest = write_manifest(tmp_path, {"a/p1/x": "hang"})
    res = _run(manifest, timeout=1.5, jobs=1)
    assert res["a/p1/x"].status is Status.ERROR and "timeout" in res["a/p1/x"].reason
    assert res["a/p1/x"].duration_s >= 1.5
    assert all(r.status is Status.GREEN for cid, r in res.items() if cid != "a/p1/x")


def test_each_worker_gets_its_profile_env(tmp_path: Path) -> None:
    # the fake cell returns error if GRADSWEEP_FAKE_PROFILE (set from the profile's env) is another profile's
    res = _run(write_manifest(tmp_path, profiles=("p1", "p2", "p3")), jobs=2)
    assert all(r.status is Status.GREEN for r in res.values()), [r.reason for r in res.values()]


def test_worker_that_cannot_start_fails_its_cells(tmp_path: Path) -> None:
    res = _run(write_manifest(tmp_path), cell_fn="tests.fakes.cells:no_such_function")
    assert all(r.status is Status.ERROR and "could not start" in r.reason for r in res.values())


def test_empty_run_and_key_order(tmp_path: Path) -> None:
    spec = RunSpec(manifest_path=write_manifest(tmp_path), cells=[], cell_fn=FAKE_CELL, loader=FAKE_LOADER)
    assert run_cells(spec) == []
    assert CellKey.parse("a/p1/x").id == "a/p1/x"


@pytest.mark.parametrize("jobs", [1, 3])
def test_jobs_do_not_change_results(tmp_path: Path, jobs: int) -> None:
    manifest = write_manifest(tmp_path, {"*/p2/y": "red", "b/p1/*": "blocked"})
    res = _run(manifest, jobs=jobs)
    assert {cid: r.status.value for cid, r in res.items()} == {
        "a/p1/x": "green", "a/p1/y": "green", "b/p1/x": "blocked_hardware", "b/p1/y": "blocked_hardware",
        "a/p2/x": "green", "a/p2/y": "red_verdict", "b/p2/x": "green", "b/p2/y": "red_verdict"}


def test_profiles_that_start_alike_share_a_worker_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiles with the same environment (and placement) share workers, which walk an op's cells across those
    profiles before the next op (its baselines are computed once per worker, not once per profile); a profile with
    an environment of its own keeps its own workers."""
    import yaml

    from gradsweep.sweep.runner import worker_pools

    assert worker_pools(["p1", "p2", "p3", "p4"], {"p3": {"X": "1"}, "p4": {"X": "1"}}, frozenset({"p2"})) == {
        "p1": "p1", "p2": "p2", "p3": "p3+p4", "p4": "p3+p4"}
    manifest = tmp_path / "pools.yaml"
    manifest.write_text(yaml.safe_dump({
        "name": "pools", "manifest_version": 1, "contract_version": "fake-1", "ops": ["a", "b"],
        "layouts": ["x", "y"], "behaviour": {},
        "profiles": {"p1": {}, "p2": {}, "p3": {"env": {"GRADSWEEP_FAKE_PROFILE": "p3"}}}}))
    log = tmp_path / "calls.log"
    monkeypatch.setenv("FAKE_CALL_LOG", str(log))
    monkeypatch.setenv("FAKE_CALL_DETAIL", "1")
    monkeypatch.delenv("GRADSWEEP_FAKE_PROFILE", raising=False)  # `check` sets it in-process (a test before this)
    res = _run(manifest, jobs=1)
    assert all(r.status is Status.GREEN for r in res.values()), [r.reason for r in res.values()]
    calls = [line.split() for line in log.read_text().splitlines()]
    pid_of = {cid: detail[0] for cid, *detail in calls}
    shared = [cid for cid, *_ in calls if "/p3/" not in cid]
    assert shared == ["a/p1/x", "a/p1/y", "a/p2/x", "a/p2/y", "b/p1/x", "b/p1/y", "b/p2/x", "b/p2/y"]
    assert len({pid_of[c] for c in shared}) == 1  # one worker for p1 and p2
    assert {pid_of[c] for c in pid_of if "/p3/" in c}.isdisjoint({pid_of[c] for c in shared})


def test_a_pool_worker_keeps_one_implementations_reference_run_per_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Walking an op's cells profile after profile, a worker drops the previous implementation's reference-layout
    run (GBs of outputs and gradients for a vocabulary-wide op) and keeps the op's shared baselines."""
    from gradsweep.harness import cell

    ident = ("m.yaml", "m", "lm_head", "cuda")
    cache = {("base", *ident): "baselines", ("run", *ident, "torch.lm_head"): "stock run",
             ("run", *ident, "triton.lm_head"): "triton run", ("run", "m.yaml", "m", "other", "cuda", "x"): "kept"}
    monkeypatch.setattr(cell, "_CACHE", dict(cache))
    cell._keep_run(ident, "triton.lm_head")
    assert set(cell._CACHE) == set(cache) - {("run", *ident, "torch.lm_head")}
