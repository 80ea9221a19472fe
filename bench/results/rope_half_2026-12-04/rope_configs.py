"""RoPE forward launch configurations with HALF a compile-time constant (notes/wip/triton-rope-constexpr-half.patch
applied), 16384 tokens x 32 heads x 128 bf16 on the H200: kernel time by CUDA events (median of 30 after 10
warm-ups), as a fraction of a same-size device copy timed the same way in the same process; every config's output
compared bit for bit with the production config's. A diagnostic for the next session's merge decision.

    PYTHONPATH=. python3 bench/results/rope_half_2026-12-04/rope_configs.py
"""

from __future__ import annotations

import math
import statistics

import torch

from gradsweep.triton_kernels import rope as R


def timed(fn, reps: int = 30) -> float:
    for _ in range(10):
        fn()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3)
    return statistics.median(out)


def main() -> None:
    rows, heads, dim, theta = 16384, 32, 128, 1.0e6
    torch.manual_seed(0)
    x = torch.randn(rows, heads, dim, device="cuda", dtype=torch.bfloat16)
    pos = torch.arange(rows, device="cuda", dtype=torch.int64) % 4096
    half = dim // 2
    coef = -math.log2(theta) / half
    y = torch.empty_like(x)
    copy_us = timed(lambda: y.copy_(x))
    print(f"copy of x: {copy_us:.1f} us ({2 * x.numel() * 2 / copy_us / 1e3:.0f} GB/s)")
    ref = R.rope_apply(x, pos, theta)
    tok0, bf, warps0 = R._config(half)
    print(f"production config: TOK {tok0}, BF {bf}, warps {warps0}, stages {R.STAGES}")
    for inverse in (False, True):
        want = R.rope_apply(x, pos, theta, inverse=inverse)
        for tok in (8, 16, 32):
            for warps in (4, 8):
                for stages in (2, 3):
                    def run(tok=tok, warps=warps, stages=stages, inverse=inverse):
                        R._rope_kernel[(R.cdiv(rows, tok),)](x, pos, y, rows, coef, NH=heads, HALF=half, TOK=tok,
                                                              BF=bf, INVERSE=inverse, STAGES=stages,
                                                              num_warps=warps)
                    try:
                        us = timed(run)
                    except Exception as exc:  # a config the compiler refuses: say so, go on
                        print(f"inverse={inverse} TOK {tok} warps {warps} stages {stages}: {type(exc).__name__}")
                        continue
                    same = torch.equal(y.view(torch.int16), want.view(torch.int16))
                    print(f"inverse={inverse} TOK {tok:2d} warps {warps} stages {stages}: {us:7.1f} us, "
                          f"{copy_us / us * 100:5.1f}% of the copy, bits {'equal' if same else 'DIFFER'}")
    assert torch.equal(R.rope_apply(x, pos, theta).view(torch.int16), ref.view(torch.int16))


if __name__ == "__main__":
    main()
