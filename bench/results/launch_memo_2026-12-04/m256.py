"""The host path of ``matmul_invariant`` by row count (the "M = 256 costs more than M = 512" puzzle): issue and wall
time per call against ``F.linear`` over 1 or 4 data copies, then cProfile and torch.profiler's CPU rows at M = 256
and 512. Run on the H200: ``PYTHONPATH=. python3 m256.py OUT``."""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.triton_kernels.gemm import matmul_invariant


def main(out: str) -> None:
    log = open(f"{out}/m256.txt", "a")

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    w = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for m in (128, 255, 256, 384, 511, 512, 768, 1024, 4096):
        xs = [torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        for rot in (1, 4):
            for i in range(30):
                matmul_invariant(xs[i % rot], w[i % rot])
            torch.cuda.synchronize()
            n = 300
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            a.record()
            for i in range(n):
                matmul_invariant(xs[i % rot], w[i % rot])
            issue = (time.perf_counter() - t0) / n * 1e6
            b.record()
            b.synchronize()
            wall = a.elapsed_time(b) / n * 1e3
            t0 = time.perf_counter()
            a.record()
            for i in range(n):
                torch.nn.functional.linear(xs[i % rot], w[i % rot])
            sissue = (time.perf_counter() - t0) / n * 1e6
            b.record()
            b.synchronize()
            swall = a.elapsed_time(b) / n * 1e3
            say(f"M={m:5d} rot={rot}: ours issue {issue:6.1f} us wall {wall:6.1f} us | cuBLAS issue {sissue:5.1f} "
                f"wall {swall:6.1f}")
    for m in (256, 512):
        x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            matmul_invariant(x, w[0])
        prof.disable()
        torch.cuda.synchronize()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        say(f"cProfile M={m}\n" + text.getvalue()[-3500:])
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
            for _ in range(100):
                matmul_invariant(x, w[0])
            torch.cuda.synchronize()
        say(f"torch.profiler M={m}\n" + tp.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))


if __name__ == "__main__":
    main(sys.argv[1])
