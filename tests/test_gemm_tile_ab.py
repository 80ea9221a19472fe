"""scripts/gemm_tile_ab.py (the Triton TMA GEMM's tile A/B, run on the GPU by `h200_closeout.sh --tile-ab`) must
time today's configuration among its variants at every row count it tries every variant at, and may name only
variants it declares: an A/B without its baseline, or one silently skipping a named variant, answers nothing."""

from __future__ import annotations

from gradsweep.triton_kernels.gemm import _tma_tiles
from scripts.gemm_tile_ab import CASES, VARIANTS


def test_todays_tiles_are_a_variant_wherever_every_variant_runs() -> None:
    shapes = {(bm, bn, bk, w, s) for _, bm, bn, bk, w, s, ws in VARIANTS if not ws}
    for m, _, _, names in CASES:
        cfg, warps, stages = _tma_tiles(m)
        today = (cfg["BM"], cfg["BN"], cfg["BK"], warps, stages)
        if names is None:
            assert today in shapes, f"M={m}: today's {today} is not among the variants"


def test_named_variants_exist_and_names_are_unique() -> None:
    names = [v[0] for v in VARIANTS]
    assert len(names) == len(set(names))
    for m, _, _, wanted in CASES:
        assert wanted is None or wanted <= set(names), f"M={m}: {sorted(set(wanted) - set(names))}"


def test_the_dw_part_walks_the_production_fold_with_each_variant_forced() -> None:
    """Under the interpreter every variant runs the interpreter's one configuration, so every bit is equal; what this
    checks is the path the GPU run takes blind: the plan, the forced tuner (its list, choice and launch memo), the
    fold, and the tuner left as it was found."""
    import torch

    from gradsweep.triton_kernels import gemm
    from scripts.gemm_tile_ab import DW_VARIANTS, dw_part

    rows: list[dict] = []
    bad = dw_part(rows, torch.Generator().manual_seed(0), steps=(200,), width=32, timer=lambda fn: (fn(), 1.0)[1],
                  warm=lambda fn: None)
    assert bad == 0 and rows[0]["folded"]
    assert [r["variant"] for r in rows[1:]] == ["BN={} BK={} w{} s{}".format(*c) for c in DW_VARIANTS]
    assert all(r.get("bits_equal") for r in rows[1:]), rows
    assert gemm._DW_TMA.configs is gemm.dw_configs and gemm._DW.configs is gemm.dw_configs
