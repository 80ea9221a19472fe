"""Next session, after `git apply notes/wip/triton-kept-tensormaps.patch notes/wip/triton-mid-m-tiles.patch`:
end-to-end (host included) time of the Triton GEMM at M = 256 / 512 / 4096, N = K = 4096, with the kept tensor maps
and with Triton's own descriptor wrapper (descs switched off on every compiled Direct), and cuBLAS; bits equal."""
import sys
import time

import torch

from gradsweep.triton_kernels import gemm

out = open(sys.argv[1], "a")


def say(s):
    print(s, flush=True)
    out.write(s + "\n")


def e2e_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t) / n * 1e6)
    return best


g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(4096, 4096, device="cuda", generator=g) * 0.02).bfloat16()
x = torch.randn(4096, 4096, device="cuda", generator=g).bfloat16()
for m in (256, 512, 4096):
    a = x[:m].contiguous()
    cub = e2e_us(lambda a=a: a @ w.t())
    kept = e2e_us(lambda a=a: gemm.matmul_invariant(a, w))
    r1 = gemm.matmul_invariant(a, w)
    saved = {}
    for k, d in gemm._MM_TMA.compiled.items():
        saved[k] = (d.launch, d.descs)
        d.launch, d.descs = d.compiled.run.launch, None
    wrapped = e2e_us(lambda a=a: gemm.matmul_invariant(a, w))
    r2 = gemm.matmul_invariant(a, w)
    for k, (launch, descs) in saved.items():
        gemm._MM_TMA.compiled[k].launch, gemm._MM_TMA.compiled[k].descs = launch, descs
    same = torch.equal(r1.view(torch.int16), r2.view(torch.int16))
    say(f"M={m}: cuBLAS {cub:.1f} us; kept maps {kept:.1f} ({kept / cub:.2f}x); Triton's wrapper {wrapped:.1f} "
        f"({wrapped / cub:.2f}x); bits equal {same}")
