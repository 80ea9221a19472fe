"""The Triton RoPE kernel's launch configurations, one by one, at sustained clocks (a diagnostic for
notes/triton_rowwise.md; not evidence).

RoPE forward reads 85% of the copy bandwidth kernels-only in the signed bench (the target is 90%), and Nsight
Compute put its default launch (16 tokens a program, 4 warps) at 0.86 waves of programs. An earlier ladder
(bench/results/rope_half_2026-12-04/configs.txt) timed each configuration by events from an idle device: too noisy
to rank. Here every configuration (tokens per program, warps, pipelining stages) runs 16384 tokens x 32 heads x 128
bf16 forward as a CUDA graph of back-to-back launches (``gemm_tile_probe.graph_time_us``), each round after 120 ms
of back-to-back work (the device at its sustained clocks, as the bench's kernels-only rounds), the configurations
in turn for ROUNDS rounds, next to a device copy of x timed the same way; the BEST fastest then run inverse too.
Every output is compared bit for bit with the production configuration's (any tiling gives the same bits: the
kernel is elementwise per token). About 45 compilations and 20 s of timing.

    python3 scripts/rope_configs.py [OUT.json]
"""

from __future__ import annotations

import json
import math
import statistics
import sys

import torch

from gradsweep.triton_kernels import rope as R
from scripts.gemm_tile_probe import graph_time_us, heat

TOKENS, HEADS, HEAD_DIM, THETA = 16384, 32, 128, 1e6
TOKS = (2, 4, 8, 16, 32)
WARPS = (2, 4, 8)
STAGES = (1, 2, 3)
ROUNDS, BEST = 3, 5


def launch(x: torch.Tensor, pos: torch.Tensor, y: torch.Tensor, tok: int, warps: int, stages: int,
           inverse: bool) -> None:
    """``rope_apply``'s launch with one configuration (the same arguments, another tiling)."""
    half = x.shape[2] // 2
    bf = R.pow2(half)
    coef = -math.log2(THETA) / half
    grid = (R.cdiv(x.shape[0], tok),)
    R._rope_kernel[grid](x, pos, y, x.shape[0], half, coef, NH=x.shape[1], TOK=tok, BF=bf, INVERSE=inverse,
                         STAGES=stages, num_warps=warps)


def ladder(keys: list[tuple], x, pos, y, copy_dst) -> tuple[float, dict[tuple, list[float]]]:
    """(copy us, us per call of every (inverse, tok, warps, stages) key), ROUNDS rounds in turn, each heated."""
    copy: list[float] = []
    times: dict[tuple, list[float]] = {k: [] for k in keys}
    for _ in range(ROUNDS):
        heat(lambda: copy_dst.copy_(x))
        copy.append(graph_time_us(lambda: copy_dst.copy_(x)))
        for key in keys:
            inv, *cfg = key
            times[key].append(graph_time_us(lambda c=tuple(cfg), i=inv: launch(x, pos, y, *c, i)))
    return statistics.median(copy), times


def main(path: str | None) -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(TOKENS, HEADS, HEAD_DIM, generator=gen, device="cuda").bfloat16()
    pos = torch.randint(0, 32768, (TOKENS,), generator=gen, device="cuda")
    y = torch.empty_like(x)
    copy_dst = torch.empty_like(x)
    tok0, _, warps0 = R._config(HEAD_DIM // 2)
    print(f"production config: TOK {tok0}, warps {warps0}, stages {R.STAGES}", flush=True)
    refs = {inv: R.rope_apply(x, pos, THETA, inverse=inv).view(torch.int16) for inv in (False, True)}
    configs = [(t, w, s) for t in TOKS for w in WARPS for s in STAGES if t * 64 >= 32 * w]  # >= one element a thread
    bits: dict[tuple, bool] = {}

    def check(keys: list[tuple]) -> list[tuple]:
        ok = []
        for key in keys:
            inv, *cfg = key
            y.fill_(float("nan"))
            try:
                launch(x, pos, y, *cfg, inv)
                torch.cuda.synchronize()
            except Exception as exc:  # out of registers / shared memory: not a candidate
                print(f"  {key}: {type(exc).__name__}", flush=True)
                continue
            bits[key] = bool(torch.equal(y.view(torch.int16), refs[inv]))
            ok.append(key)
        return ok

    c, times = ladder(check([(False, *cfg) for cfg in configs]), x, pos, y, copy_dst)
    best = sorted(times, key=lambda k: statistics.median(times[k]))[:BEST]
    prod = (False, tok0, warps0, R.STAGES)
    inverse = check([(True, *k[1:]) for k in best] + ([(True, *prod[1:])] if prod not in best else []))
    c_inv, t_inv = ladder(inverse, x, pos, y, copy_dst)
    times.update(t_inv)
    ceiling = {False: c, True: c_inv}  # each row against the copy timed in its own ladder's rounds
    print(f"copy of x: {c:.1f} us ({2 * x.numel() * 2 / c / 1e3:.0f} GB/s); in the inverse ladder {c_inv:.1f} us",
          flush=True)
    rows = []
    for key, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        inv, tok, w, s = key
        med = statistics.median(ts)
        print(f"inverse={inv!s:5} TOK {tok:2d} warps {w} stages {s}: {med:7.1f} us, "
              f"{ceiling[inv] / med:6.1%} of the copy, "
              f"bits {'equal' if bits[key] else 'DIFFER'}", flush=True)
        rows.append({"inverse": inv, "tok": tok, "warps": w, "stages": s, "us": [round(t, 2) for t in ts],
                     "copy_fraction": round(ceiling[inv] / med, 4), "bits_equal": bits[key]})
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_us": round(c, 2),
                       "copy_us_inverse_ladder": round(c_inv, 2), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
