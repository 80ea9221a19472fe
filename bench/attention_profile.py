"""Where attention's time goes on a GPU: wall time per call and a torch.profiler table (kernels vs the rest).

Usage (CUDA box): PYTHONPATH=. python3 bench/attention_profile.py
"""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels import attention as attn

B, S, H, D = 8, 1024, 32, 128


def main() -> None:
    q, k, v, do = (torch.randn(B * S, H, D, device="cuda").to(torch.bfloat16) for _ in range(4))
    lengths = [S] * B
    rows = RowIdentity.packed(lengths)

    def fwd() -> None:
        attn.attention(q, k, v, rows, attn.AttentionCache(lengths, H, D, "cuda"))

    def fwd_bwd() -> None:
        qq = q.detach().requires_grad_(True)
        cache = attn.AttentionCache(lengths, H, D, "cuda")
        attn.attention(qq, k, v, rows, cache).backward(do)
        cache.finish()

    for fn in (fwd, fwd_bwd):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / 10 * 1e3
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        print(f"== {fn.__name__}: wall {wall:.3f} ms per call")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
