"""A sweep worker's environment: the CUDA allocator grows expandable segments unless someone chose otherwise."""

from __future__ import annotations

from gradsweep.sweep.runner import ALLOC_CONF, _worker_env


def test_workers_default_to_expandable_segments(monkeypatch):
    monkeypatch.delenv(ALLOC_CONF, raising=False)
    assert _worker_env({})[ALLOC_CONF] == "expandable_segments:True"


def test_the_callers_and_the_profiles_choice_win(monkeypatch):
    monkeypatch.setenv(ALLOC_CONF, "max_split_size_mb:512")
    assert _worker_env({})[ALLOC_CONF] == "max_split_size_mb:512"
    monkeypatch.delenv(ALLOC_CONF)
    assert _worker_env({ALLOC_CONF: "backend:native"})[ALLOC_CONF] == "backend:native"
