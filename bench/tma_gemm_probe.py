"""Experiment (issue 12) that led to the shipped `_mm_tma_kernel`: a persistent, TMA-fed Triton GEMM with one
K order for every M, against cuBLAS and gradsweep's current ``_mm_kernel`` in the same run (GPU time:
CUDA-graph replay of 20 calls, median of 5). Bits: row 0 of an M=1 call against row 0 of the full call, every
config against the first, and the output against gradsweep's kernel (max abs difference; 0: the same bits).

Usage (repo root, on the H200): PYTHONPATH=. python3 bench/tma_gemm_probe.py OUT.json
Result of 2026-11-30: bench/results/tma_gemm_h200.json (notes/triton_gemm_vocab.md, third pass).
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from gradsweep.triton_kernels.gemm import matmul_invariant


def alloc(size, align, stream):
    return torch.empty(size, dtype=torch.int8, device="cuda")


triton.set_allocator(alloc)
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count

@triton.jit
def _tma_mm(a_desc, b_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
            GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, WS: tl.constexpr):
    start = tl.program_id(0)
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    per_group = GROUP_M * n_n
    for t in tl.range(start, n_m * n_n, NUM_SMS, flatten=True, warp_specialize=WS):
        g = t // per_group
        fm = g * GROUP_M
        gs = min(n_m - fm, GROUP_M)
        pm = fm + (t % gs)
        pn = (t % per_group) // gs
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):  # one K order for every M: ki ascending, BK-wide wgmma chains
            a = a_desc.load([pm * BM, ki * BK])
            b = b_desc.load([pn * BN, ki * BK])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pm * BM, pn * BN], acc.to(tl.bfloat16))


def tma_mm(x, w, cfg):
    M, K = x.shape
    N = w.shape[0]
    BM, BN, BK, GM, stages, warps, ws = cfg
    out = torch.empty((M, N), dtype=torch.bfloat16, device=x.device)
    ad = TensorDescriptor(x, [M, K], [K, 1], [BM, BK])
    bd = TensorDescriptor(w, [N, K], [K, 1], [BN, BK])
    cd = TensorDescriptor(out, [M, N], [N, 1], [BM, BN])
    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)
    _tma_mm[(min(NUM_SMS, tiles),)](ad, bd, cd, M, N, K, BM=BM, BN=BN, BK=BK, GROUP_M=GM, NUM_SMS=NUM_SMS,
                                     WS=ws, num_stages=stages, num_warps=warps)
    return out


def gpu_ms(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = []
    for _ in range(5):
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        best.append(s.elapsed_time(e) / reps)
    return sorted(best)[2]


CFGS = [(128, 256, 64, 8, 3, 8, False), (128, 256, 64, 8, 3, 8, True), (128, 128, 64, 8, 4, 8, True),
        (128, 128, 64, 8, 4, 4, False), (64, 128, 64, 8, 4, 4, False), (64, 256, 64, 8, 3, 4, True)]
SHAPES = [(4096, 4096, 4096), (16384, 4096, 4096), (4096, 14336, 4096), (4096, 151936, 4096), (256, 4096, 4096),
          (16, 4096, 4096)]
res = []
torch.manual_seed(0)
for M, N, K in SHAPES:
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(N, K, device="cuda", dtype=torch.bfloat16) / 64
    cub = gpu_ms(lambda x=x, w=w: torch.matmul(x, w.T))
    ours = gpu_ms(lambda x=x, w=w: matmul_invariant(x, w))
    row = {"M": M, "N": N, "K": K, "cublas_ms": cub, "gradsweep_mm_ms": ours, "gradsweep_ratio": ours / cub}
    ref = matmul_invariant(x, w)
    for cfg in CFGS:
        try:
            t = gpu_ms(lambda x=x, w=w, cfg=cfg: tma_mm(x, w, cfg))
            y = tma_mm(x, w, cfg)
            y1 = tma_mm(x[:1].contiguous(), w, cfg)
            same_rows = bool(torch.equal(y1.view(torch.int16), y[:1].view(torch.int16)))
            same_cfg0 = bool(torch.equal(y.view(torch.int16), tma_mm(x, w, CFGS[0]).view(torch.int16)))
            err = float((y.float() - ref.float()).abs().max())
            row[str(cfg)] = {"ms": t, "ratio": t / cub, "row0_bits_equal_M1": same_rows, "bits_equal_cfg0": same_cfg0,
                             "max_abs_vs_gradsweep": err}
        except Exception as ex:
            row[str(cfg)] = f"failed: {type(ex).__name__}: {str(ex)[:200]}"
    res.append(row)
    print(json.dumps(row), flush=True)
with open(sys.argv[1], "w") as fh:
    json.dump(res, fh, indent=1)
