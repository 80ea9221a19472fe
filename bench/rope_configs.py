"""Sweep RoPE launch configurations on a GPU (all give the same bits: RoPE is elementwise per token),
and time embedding backward end to end (host fold plan included) against torch. Prints a table.

Usage (CUDA box): PYTHONPATH=. python3 bench/rope_configs.py --out rope_configs.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math

import torch
import triton
import triton.testing

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels import embedding as emb_mod
from gradsweep.triton_kernels import rope as rope_mod


def _copy_ceiling() -> float:
    src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="rope_configs.json")
    args = ap.parse_args()
    ceiling = _copy_ceiling()
    rows, heads, dim = 16384, 32, 128
    x = torch.randn(rows, heads, dim, device="cuda").to(torch.bfloat16)
    pos = torch.randint(0, 8192, (rows,), device="cuda")
    ref = rope_mod.rope_apply(x, pos, 10000.0)
    half = dim // 2
    coef = -math.log2(10000.0) / half
    bf = triton.next_power_of_2(half)
    nbytes = 2 * x.numel() * 2
    results = []
    for tok, warps, stages in itertools.product((8, 16, 32, 64), (4, 8), (2, 3, 4)):
        y = torch.empty_like(x)

        def launch(y=y, tok=tok, warps=warps, stages=stages):
            rope_mod._rope_kernel[(triton.cdiv(rows, tok),)](x, pos, y, rows, half, coef, NH=heads, TOK=tok, BF=bf,
                                                            INVERSE=False, STAGES=stages, num_warps=warps)
        launch()
        same = bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
        ms = triton.testing.do_bench(launch, warmup=25, rep=200, return_mode="median")
        gbs = nbytes / (ms * 1e-3) / 1e9
        results.append({"tok": tok, "warps": warps, "stages": stages, "ms": ms, "gbs": gbs,
                        "pct_copy": 100 * gbs / ceiling, "bitwise_same_as_production": same})
        print(f"rope tok={tok:3d} warps={warps} stages={stages}: {ms:.4f} ms {gbs:7.0f} GB/s "
              f"{100 * gbs / ceiling:5.1f}% same_bits={same}", flush=True)
    prod = rope_mod._config(half)
    print(f"production config (tok, BF, warps) = {prod}, copy ceiling {ceiling:.0f} GB/s")

    emb = []
    lengths = [1260] * 13
    lengths[-1] = 16384 - sum(lengths[:-1])
    rows_id = RowIdentity.packed(lengths)
    for vocab in (32000, 128256):
        ids = torch.randint(0, vocab, (16384,), device="cuda")
        dy = torch.randn(16384, 4096, device="cuda").to(torch.bfloat16)
        mg = torch.zeros(vocab, 4096, device="cuda")

        def ours(ids=ids, dy=dy, mg=mg):
            emb_mod.embedding_backward(ids, dy, rows_id, CanonicalFold(mg, lengths, 1))

        def stock(ids=ids, dy=dy, vocab=vocab):
            torch.ops.aten.embedding_dense_backward(dy, ids, vocab, -1, False)

        t_ours = triton.testing.do_bench(ours, warmup=10, rep=100, return_mode="median")
        t_torch = triton.testing.do_bench(stock, warmup=10, rep=100, return_mode="median")
        emb.append({"vocab": vocab, "ours_e2e_ms": t_ours, "torch_ms": t_torch, "ratio": t_ours / t_torch})
        print(f"embedding bwd e2e V={vocab}: ours {t_ours:.3f} ms, torch {t_torch:.3f} ms, "
              f"ratio {t_ours / t_torch:.2f} (target <= 1.5)", flush=True)
    with open(args.out, "w") as f:
        json.dump({"copy_ceiling_gbs": ceiling, "rope": results, "embedding_e2e": emb}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
