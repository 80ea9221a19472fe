"""The shipped workloads exercise what the kernels can get wrong (issue 8).

default.yaml (CI) must cross canonical tiles of every tile size in use, put chunk boundaries on and off
tile boundaries, make odd and even calls and hold a one-token sample; the release manifest must run every
layout of every op. A missing shipped manifest is a failure, never a skip.
"""

from __future__ import annotations

from importlib import import_module

from gradsweep.layouts import build_calls
from gradsweep.manifest import MANIFEST_DIR, load_manifest
from gradsweep.ops.registry import get_op

DEFAULT = load_manifest(MANIFEST_DIR / "default.yaml")


def _tile_sizes() -> set[int]:
    """Every canonical tile size a kernel of the default manifest folds over (> 1 token)."""
    sizes: set[int] = set()
    for name in DEFAULT.ops:
        for cand in get_op(name).candidates.values():
            if cand.family == "torch":
                continue
            try:
                sizes |= set(cand.fold_tiles().values())
            except ImportError:  # a family that cannot load here (no extension): its TILEs are read below
                pass
    for family in ("triton_kernels", "cuda_kernels"):
        for name in DEFAULT.ops:
            try:
                mod = import_module(f"gradsweep.{family}.{name}")
            except ImportError:
                continue
            if isinstance(getattr(mod, "TILE", None), int):
                sizes.add(mod.TILE)
            config = getattr(mod, "DEFAULT_CONFIG", None)
            if config is not None and isinstance(getattr(config, "tile", None), int):
                sizes.add(config.tile)
    return {t for t in sizes if t > 1}


def test_default_workload_crosses_every_tile_size_in_use():
    tiles = _tile_sizes()
    assert {32, 64} <= tiles, tiles
    longest = max(DEFAULT.samples.lengths)
    for t in tiles:
        assert longest > 2 * t, f"no sample spans 3 canonical tiles of {t}"
    assert 1 in DEFAULT.samples.lengths


def test_default_chunk_boundaries_fall_on_and_off_tile_boundaries_with_odd_and_even_calls():
    chunks = DEFAULT.layouts["bn_chunked"].chunks
    boundaries = [sum(c[:i]) for c in chunks for i in range(1, len(c))]
    for t in _tile_sizes():
        assert any(b % t == 0 for b in boundaries), f"no chunk boundary on a tile of {t}"
        assert any(b % t != 0 for b in boundaries), f"no chunk boundary inside a tile of {t}"
    calls = build_calls("bn_chunked", DEFAULT.layouts["bn_chunked"], DEFAULT.samples.lengths, DEFAULT.seed)
    sizes = [c.num_rows for c in calls]
    assert any(n % 2 for n in sizes) and any(n % 2 == 0 for n in sizes), sizes


def test_every_shipped_manifest_loads():
    for name in ("default.yaml", "h200.yaml", "ci_smoke.yaml"):
        assert (MANIFEST_DIR / name).is_file(), f"shipped manifest {name} is missing"
        load_manifest(MANIFEST_DIR / name)


def test_release_manifest_runs_every_layout_of_every_op():
    release = load_manifest(MANIFEST_DIR / "h200.yaml")
    missing = {op: sorted(set(get_op(op).layouts) - set(release.layouts_for(op))) for op in release.ops}
    assert {op: lays for op, lays in missing.items() if lays} == {}
    assert set(release.ops) >= set(DEFAULT.ops)
    assert release.reruns >= 3
