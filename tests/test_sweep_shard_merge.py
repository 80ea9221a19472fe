"""Sharding is deterministic and merging the shards gives exactly the unsharded matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from gradsweep.errors import BadInput
from gradsweep.evidence.provenance import Provenance, collect_provenance
from gradsweep.evidence.signing import load_signer, write_keypair
from gradsweep.evidence.trust import ad_hoc_signers
from gradsweep.evidence.verify import check_signature
from gradsweep.results import CellKey
from gradsweep.sweep.api import SweepOptions, execute_sweep, prepare_sweep
from gradsweep.sweep.merge import merge_shards
from gradsweep.sweep.shard import Shard, parse_shard, select_shard
from tests.fakes.helpers import FAKE_CELL, FAKE_LOADER, REPO, write_manifest


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("shards")
    key = base / "k.pem"
    write_keypair(key)
    manifest = write_manifest(base, {"a/p1/y": "red", "b/p2/*": "blocked", "c/p2/x": "raise"},
                              ops=("a", "b", "c"), layouts=("x", "y", "z"))
    prov = collect_provenance(REPO)

    def sweep(out: str, shard: str | None = None, tree: Path | None = None) -> Path:
        opts = SweepOptions(manifest=manifest, out=base / out, key=key, shard=shard, cell_fn=FAKE_CELL,
                            loader=FAKE_LOADER, jobs=2, tree=tree)
        return execute_sweep(prepare_sweep(opts, lambda _m: None), provenance=prov).out

    full = sweep("full.json")
    shards = [sweep(f"s{k}.json", f"{k}/3") for k in (1, 2, 3)]
    return {"base": base, "key": key, "full": full, "shards": shards, "sweep": sweep,
            "trusted": ad_hoc_signers([base / "k.pub.pem"]), "prov": prov}


def test_parse_shard() -> None:
    assert parse_shard("2/3") == Shard(2, 3)
    for bad in ("3/2", "0/2", "x", "1/0", "1-2", ""):
        with pytest.raises(BadInput, match="--shard"):
            parse_shard(bad)


def test_shards_partition_deterministically() -> None:
    cells = [CellKey(op=o, profile=p, layout=lay) for o in "cab" for p in ("p2", "p1") for lay in "yx"]
    parts = [select_shard(cells, Shard(k, 3)) for k in (1, 2, 3)]
    ids = [c.id for part in parts for c in part]
    assert sorted(ids) == sorted(c.id for c in cells) and len(set(ids)) == len(cells)
    assert parts == [select_shard(list(reversed(cells)), Shard(k, 3)) for k in (1, 2, 3)]
    assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1


def _matrix(path: Path, trusted: list) -> dict[str, tuple[str, bool]]:
    pred, _ = check_signature(path, trusted)
    return {r.result.key.id: (r.result.status.value, r.untracked_red) for r in pred.cells}


def test_merge_equals_unsharded(world: dict) -> None:
    out = world["base"] / "merged.json"
    merged = merge_shards(list(reversed(world["shards"])), world["trusted"], load_signer(world["key"]), out)
    full, _ = check_signature(world["full"], world["trusted"])
    assert _matrix(out, world["trusted"]) == _matrix(world["full"], world["trusted"])
    assert len(merged.cells) == 18
    assert merged.tally == full.tally and merged.verdict == full.verdict
    assert merged.selection.shards == ["1/3", "2/3", "3/3"] and len(merged.runs) == 3
    assert merged.source == full.source and merged.manifest == full.manifest


def test_merge_refuses_missing_duplicate_and_foreign(world: dict, tmp_path: Path) -> None:
    signer = load_signer(world["key"])
    s1, s2, s3 = world["shards"]
    out = tmp_path / "m.json"
    with pytest.raises(BadInput, match=r"missing shard.*2/3"):
        merge_shards([s1, s3], world["trusted"], signer, out)
    with pytest.raises(BadInput, match="given twice"):
        merge_shards([s1, s2, s3, s2], world["trusted"], signer, out)
    with pytest.raises(BadInput, match="not a shard"):
        merge_shards([s1, s2, s3, world["full"]], world["trusted"], signer, out)
    tree = tmp_path / "tree"
    (tree / "gradsweep").mkdir(parents=True)
    (tree / "gradsweep" / "x.py").write_text("y = 1\n")
    other = world["sweep"]("other-tree-s2.json", "2/3", tree)
    with pytest.raises(BadInput, match="source tree"):
        merge_shards([s1, other, s3], world["trusted"], signer, out)
    write_keypair(tmp_path / "stranger.pem")
    with pytest.raises(BadInput, match="untrusted"):
        merge_shards([s1, s2, s3], ad_hoc_signers([tmp_path / "stranger.pub.pem"]), signer, out)
    assert not out.exists()


def test_merge_refuses_shards_of_different_fold_planners(world: dict, tmp_path: Path) -> None:
    """The same sources with another compiled fold planner (another machine's build): the shards planned their
    folds with different binaries, so they are not one run's cells."""
    import shutil
    from importlib.machinery import EXTENSION_SUFFIXES

    tree = tmp_path / "tree"
    for sub in ("gradsweep", "csrc"):
        shutil.copytree(REPO / sub, tree / sub, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for ext in (REPO / "gradsweep").glob("_C*.so"):  # the same CUDA extension as the other shards'
        shutil.copy(ext, tree / "gradsweep")
    (tree / "gradsweep" / f"_fold_plan{EXTENSION_SUFFIXES[0]}").write_bytes(b"\x7fELF another machine's build")
    other = world["sweep"]("other-planner-s2.json", "2/3", tree)
    s1, _, s3 = world["shards"]
    with pytest.raises(BadInput, match="compiled fold planner"):
        merge_shards([s1, other, s3], world["trusted"], load_signer(world["key"]), tmp_path / "m.json")


def test_provenance_is_measured(world: dict) -> None:
    prov: Provenance = world["prov"]
    import torch

    assert prov.torch == torch.__version__
    assert prov.cuda_available == torch.cuda.is_available()
    if not prov.cuda_available:
        assert prov.gpu_name is None and prov.sm is None and prov.driver is None
