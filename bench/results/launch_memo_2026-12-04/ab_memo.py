"""A/B of the memoised GEMM launches (``FastLaunch.memo``) against the unmemoised path (build the arguments, then the
ordinary ``FastLaunch.__call__``) in one process: issue and wall time per call of ``matmul_invariant`` (forward and
dX-shaped), bits compared. Run on the H200: ``PYTHONPATH=. python3 ab_memo.py OUT``."""

from __future__ import annotations

import sys
import time

import torch

from gradsweep.triton_kernels import _launch, gemm

REAL_MEMO = _launch.FastLaunch.memo


def unmemo(self, key, build) -> None:
    grid, args, consts, warps, stages = build()
    self(grid, args, consts, warps, stages)


def timed(fn, n: int = 400) -> tuple[float, float]:
    """(issue us, wall us) per call of ``n`` back-to-back calls after 30 warm-ups."""
    for i in range(30):
        fn(i)
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    for i in range(n):
        fn(i)
    issue = (time.perf_counter() - t0) / n * 1e6
    b.record()
    b.synchronize()
    return issue, a.elapsed_time(b) / n * 1e3


def main(out: str) -> None:
    log = open(f"{out}/ab_memo.txt", "a")

    def say(text: str) -> None:
        print(text, flush=True)
        log.write(text + "\n")
        log.flush()

    def fmt(t: tuple[float, float]) -> str:
        return f"{t[0]:5.1f}/{t[1]:6.1f}"

    w = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for m in (1, 16, 100, 256, 512, 4096):
        xs = [torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        res = {}
        for name in ("memo", "plain", "memo2", "plain2"):
            _launch.FastLaunch.memo = REAL_MEMO if name.startswith("memo") else unmemo
            fwd = timed(lambda i, xs=xs: gemm.matmul_invariant(xs[i % 4], w[i % 4]))
            dx = timed(lambda i, xs=xs: gemm.matmul_invariant(xs[i % 4], w[i % 4].t()))
            res[name] = (fwd, dx)
        stock = timed(lambda i, xs=xs: torch.nn.functional.linear(xs[i % 4], w[i % 4]))
        _launch.FastLaunch.memo = REAL_MEMO
        a = gemm.matmul_invariant(xs[0], w[0])
        _launch.FastLaunch.memo = unmemo
        b = gemm.matmul_invariant(xs[0], w[0])
        _launch.FastLaunch.memo = REAL_MEMO
        same = torch.equal(a.view(torch.int16), b.view(torch.int16))
        say(f"M={m:5d} fwd issue/wall us: memo {fmt(res['memo'][0])} {fmt(res['memo2'][0])} plain "
            f"{fmt(res['plain'][0])} {fmt(res['plain2'][0])} | dX memo {fmt(res['memo'][1])} plain "
            f"{fmt(res['plain'][1])} | cuBLAS {fmt(stock)} | bits equal {same}")


if __name__ == "__main__":
    main(sys.argv[1])
