"""Time and bit-check each candidate configuration of the Triton family's swapped small-M GEMM on a GPU, one by one
(a diagnostic for notes/triton_gemm_vocab.md; not evidence).

The swapped launch's tuner keeps the fastest of a few (BM over N, BN over M, BK, warps, stages) shapes. At M = 1
it ran 1.3x cuBLAS with 64 programs at N = 4096 (BM = 64: one wgmma tile of weight rows each), so half the
multiprocessors idle in a bandwidth-bound product. BM = 16 / 32 tiles compile to mma.sync (no wgmma) and give 256 /
128 programs. Every candidate must give the bits of the unswapped TMA kernel's rows of a 4096-row product (the
contract the GPU test checks); this prints each candidate's bits verdict and its graph-replay time next to cuBLAS.
Run on 2026-12-04 (H200, triton 3.6, bench/results/triton_swap_m1_2026-12-04/): every candidate gave the bits;
the narrow tiles were slower at every shape, the deeper pipelines faster at M = 1
(the M = 1 bucket of ``_SWAP_SHAPES`` came from it).

    python3 scripts/gemm_swap_configs.py [OUT.json]
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.testing

from gradsweep.triton_kernels import gemm

SHAPES = [(1, 4096, 4096), (16, 4096, 4096), (32, 4096, 4096), (1, 4096, 14336), (16, 14336, 4096),
          (1, 151936, 4096)]  # (M, N, K) of x[M, K] @ W[N, K]^T
CANDIDATES = [  # the current bucket-16 list first, then the narrower and deeper tiles
    (64, 16, 128, 4, 4), (64, 16, 256, 4, 3), (128, 16, 128, 4, 4), (64, 16, 64, 4, 6), (128, 16, 64, 8, 5),
    (64, 16, 256, 4, 5), (64, 16, 128, 4, 8),
    (32, 16, 128, 4, 6), (32, 16, 256, 4, 4), (32, 16, 256, 4, 6),
    (16, 16, 256, 2, 6), (16, 16, 256, 4, 6), (16, 16, 512, 4, 4), (32, 16, 512, 4, 3),
]


def launch(cfg: tuple, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> None:
    """out = x @ w^T through ``_mm_kernel`` swapped (as ``_launch_mm_swapped`` calls it) with one configuration."""
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    b = w.t()
    sa, sb, so = x.stride(), b.stride(), out.stride()
    grid = (triton.cdiv(n, bm) * triton.cdiv(m, bn),)
    gemm._mm_kernel[grid](b, x, out, n, m, k, sb[1], sb[0], sa[1], sa[0], so[1], so[0], BM=bm, BN=bn, BK=bk,
                          GROUP_M=8, ACC_IN=False, EVEN_K=k % bk == 0, HINT_N=False, num_warps=warps,
                          num_stages=stages)


def main(path: str | None) -> None:
    torch.manual_seed(0)
    rows = []
    for m, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        big = torch.randn(4096, k, device="cuda", dtype=torch.bfloat16)
        ref = gemm.matmul_invariant(big, w)[:m]  # the M = 4096 rows: the bits every M must give
        x = big[:m].contiguous()
        cublas = triton.testing.do_bench_cudagraph(lambda x=x, w=w: x @ w.t(), rep=100)
        print(f"M={m} N={n} K={k}: cuBLAS {cublas * 1e3:.1f} us", flush=True)
        for cfg in CANDIDATES:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            try:
                launch(cfg, x, w, out)
                torch.cuda.synchronize()
            except Exception as exc:  # out of shared memory / registers: not a candidate
                print(f"  {cfg}: {type(exc).__name__}", flush=True)
                continue
            same = bool(torch.equal(out.view(torch.int16), ref.view(torch.int16)))
            t = triton.testing.do_bench_cudagraph(lambda c=cfg, o=out, x=x, w=w: launch(c, x, w, o), rep=100)
            rows.append({"m": m, "n": n, "k": k, "config": cfg, "us": round(t * 1e3, 2),
                         "cublas_us": round(cublas * 1e3, 2), "bits_equal": same})
            print(f"  {cfg}: {t * 1e3:7.1f} us  {t / cublas:5.2f}x  bits {'equal' if same else 'DIFFER'}", flush=True)
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
