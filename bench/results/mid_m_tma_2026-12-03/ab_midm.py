"""A/B on the H200 (kernel time by CUDA graph replay, no host): the Triton GEMM at 256 <= M <= 2048, N = K = 4096,
fwd and dX: the pointer kernel (Tuner'd), the TMA kernel with the mid tiles (64x128x64 w4 s5), with 128x128x64 w8 s4,
and with the large tiles (128x256x64 w8 s3); cuBLAS. Bits: every variant's rows against an M = 4096 call (raw)."""
import sys
import time

import torch
from triton.testing import do_bench_cudagraph

from gradsweep.triton_kernels import gemm

out = open(sys.argv[1], "a")
t_start = time.time()


def say(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    out.write(s + "\n")
    out.flush()


def t_us(fn):
    fn()
    torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3


MID = dict(gemm._TMA_MID_CFG), gemm._TMA_MID_WARPS, gemm._TMA_MID_STAGES
VARIANTS = {
    "pointer": dict(mid_min=1 << 40, big_min=1 << 40, mid=MID),
    "mid64x128": dict(mid_min=1, big_min=1 << 40, mid=MID),
    "mid128x128": dict(mid_min=1, big_min=1 << 40, mid=({"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8}, 8, 4)),
    "large": dict(mid_min=1, big_min=1, mid=MID),
}


def set_variant(v):
    gemm.TMA_MID_MIN_M = v["mid_min"]
    gemm.TMA_MIN_M = v["big_min"]
    gemm._TMA_MID_CFG, gemm._TMA_MID_WARPS, gemm._TMA_MID_STAGES = v["mid"]


N = K = 4096
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(N, K, device="cuda", generator=g) * 0.02).bfloat16()
x_all = torch.randn(4096, K, device="cuda", generator=g).bfloat16()
default = dict(mid_min=gemm.TMA_MID_MIN_M, big_min=gemm.TMA_MIN_M, mid=MID)
for kind in ("fwd", "dX"):
    b = w.t() if kind == "fwd" else w
    set_variant(default)
    ref = gemm._launch_mm(x_all, b, torch.empty(4096, N, dtype=torch.bfloat16, device="cuda"), False)
    for m in (512, 768, 1023):
        if time.time() - t_start > 75:
            say("deadline")
            break
        a = x_all[:m].contiguous()
        cub = t_us(lambda a=a, b=b: a @ b)
        row = [f"{kind} M={m}: cuBLAS {cub:.1f} us"]
        for name, v in VARIANTS.items():
            set_variant(v)
            o = torch.empty(m, N, dtype=torch.bfloat16, device="cuda")
            try:
                us = t_us(lambda a=a, b=b, o=o: gemm._launch_mm(a, b, o, False))
                same = torch.equal(o.view(torch.int16), ref[:m].view(torch.int16))
                row.append(f"{name} {us:.1f} ({us / cub:.2f}x){'' if same else ' BITS DIFFER'}")
            except Exception as e:
                row.append(f"{name} failed {e!r}"[:120])
        set_variant(default)
        say("; ".join(row))
say(f"done in {time.time() - t_start:.0f} s")
