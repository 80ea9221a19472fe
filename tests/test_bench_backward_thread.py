"""``gradsweep bench --backward-thread``: where the timed backwards run is one setting for every side of a run,
applied while the cases are timed, restored afterwards, recorded in the signed evidence and shown by its reports.

Why it is a setting at all: a per-op bench step makes one backward call, and on torch's default engine each call
hands its graph to the engine's device thread, a cost a trainer's step pays once for its whole graph; on the H200
the host-bound Python backwards lost 80-280 us a step to it (bench/results/engine_thread_2026-12-04/)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from gradsweep.bench.api import BenchOptions, run_bench
from gradsweep.bench.evidence import read_bench
from gradsweep.cli import app
from gradsweep.errors import BadInput
from gradsweep.evidence.signing import write_keypair
from gradsweep.manifest import MANIFEST_DIR
from gradsweep.report.bench import readme_block, render_bench_markdown
from tests.test_bench_evidence import PlantedTimer

REPO = Path(__file__).resolve().parents[1]


class EngineSeeingTimer(PlantedTimer):
    """The planted clock, noting the engine's setting each time a case's side is timed (the ceilings, timed first,
    run no backward)."""

    def __init__(self) -> None:
        self.seen: list[bool] = []

    def e2e(self, calls):
        if hasattr(calls[0], "mode"):  # a case's step (OpStep), not a ceiling's callable
            self.seen.append(torch.autograd.is_multithreading_enabled())
        return super().e2e(calls)


def _bench(tmp_path: Path, thread: str | None) -> tuple:
    key = tmp_path / "keys" / "k.pem"
    write_keypair(key)
    timer = EngineSeeingTimer()
    extra = {} if thread is None else {"backward_thread": thread}
    opts = BenchOptions(manifest=MANIFEST_DIR / "ci_smoke.yaml", ops=["rms_norm"], out=tmp_path / "b.evidence.json",
                        key=key, quick=True, timer=timer, argv=["gradsweep", "bench", "--quick"], **extra)
    return run_bench(opts), timer


@pytest.mark.parametrize(("thread", "during"), [(None, True), ("worker", True), ("caller", False)])
def test_every_side_is_timed_under_the_chosen_engine_and_the_choice_is_signed(tmp_path, thread, during):
    assert torch.autograd.is_multithreading_enabled()
    outcome, timer = _bench(tmp_path, thread)
    assert timer.seen and set(timer.seen) == {during}  # stock and the family alike, every mode
    assert torch.autograd.is_multithreading_enabled()  # restored
    pred = read_bench(outcome.out)
    want = thread or "worker"
    assert pred.runs[0].backward_thread == want and pred.schema_version == 4
    words = "calling thread" if want == "caller" else "device thread (torch's default)"
    assert words in render_bench_markdown(pred) and words in readme_block(pred, "b.evidence.json")


def test_the_setting_is_restored_when_a_case_raises(tmp_path, monkeypatch):
    import gradsweep.bench.api as api

    def boom(*args, **kwargs):
        assert not torch.autograd.is_multithreading_enabled()
        raise RuntimeError("planted")

    monkeypatch.setattr(api, "run_case", boom)
    with pytest.raises(RuntimeError, match="planted"):
        _bench(tmp_path, "caller")
    assert torch.autograd.is_multithreading_enabled()


def test_an_unknown_thread_is_bad_input_naming_the_option(tmp_path):
    with pytest.raises(BadInput, match="--backward-thread 'sideways': use worker or caller"):
        _bench(tmp_path, "sideways")
    assert not (tmp_path / "b.evidence.json").exists()
    result = CliRunner().invoke(app, ["bench", str(MANIFEST_DIR / "ci_smoke.yaml"), "--quick", "--backward-thread",
                                      "sideways", "-o", str(tmp_path / "c.evidence.json")])
    assert result.exit_code == 2 and "--backward-thread 'sideways'" in result.output
    assert not (tmp_path / "c.evidence.json").exists()


def test_files_from_before_the_field_read_as_timed_on_the_device_thread():
    """Schema 2 files carry no setting: they were timed on torch's default engine, and say so (a kept run of the
    H200, never re-signed: evidence/bench/ moves to the newest schema with every release)."""
    pred = read_bench(REPO / "bench" / "results" / "rope_half_2026-12-04" / "rope-base1.evidence.json")
    assert pred.schema_version == 2 and pred.runs[0].backward_thread == "worker"
    assert "device thread (torch's default)" in render_bench_markdown(pred)
