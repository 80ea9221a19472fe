"""M = 1: today's _mm_kernel (M specialised to 1 by Triton) against the same kernel with do_not_specialize M; bits."""
import sys

import torch
import triton
from triton.testing import do_bench_cudagraph

from gradsweep.triton_kernels import gemm

out = open(sys.argv[1], "a")


def say(s):
    print(s, flush=True)
    out.write(s + "\n")


nospec = triton.jit(do_not_specialize=["M"])(gemm._mm_kernel.fn)
N = K = 4096
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).bfloat16()
x = torch.randn(64, K, device="cuda", generator=g).bfloat16()
for kind in ("fwd", "dX"):
    b = w.t() if kind == "fwd" else w
    hint = b.stride(1) == 1
    for m in (1, 2, 16):
        a = x[:m].contiguous()
        o1 = torch.empty(m, N, dtype=torch.bfloat16, device="cuda")
        o2 = torch.empty_like(o1)
        gemm._launch_mm(a, b, o1, False)
        cur = do_bench_cudagraph(lambda a=a, b=b, o1=o1: gemm._launch_mm(a, b, o1, False), rep=40) * 1e3
        cfg = dict(BM=16, BN=32, BK=128, GROUP_M=8)
        grid = (triton.cdiv(m, 16) * triton.cdiv(N, 32),)

        def run(a=a, b=b, o2=o2, m=m, grid=grid, hint=hint, cfg=cfg):
            nospec[grid](a, b, o2, m, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), o2.stride(0),
                         o2.stride(1), **cfg, ACC_IN=False, EVEN_K=True, HINT_N=hint, num_warps=4, num_stages=5)
        run()
        ns = do_bench_cudagraph(run, rep=40) * 1e3
        cub = do_bench_cudagraph(lambda a=a, b=b: a @ b, rep=40) * 1e3
        same = torch.equal(o1.view(torch.int16), o2.view(torch.int16))
        say(f"{kind} M={m}: cuBLAS {cub:.1f} us, today {cur:.1f} us, no M specialisation {ns:.1f} us, "
            f"bits equal {same}")
