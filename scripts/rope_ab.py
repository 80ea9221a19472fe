"""The Triton RoPE kernel (one block per program: every head of TOK tokens loaded at once) against the kernel it
replaced (a software-pipelined loop over heads, kept here as the baseline), at sustained clocks, bits compared: the
gate of that change and a diagnostic for notes/triton_rowwise.md (not evidence).

Why: the loop kernel read 86-89% of the copy bandwidth, and no launch configuration of it passed 87.5% (the launch
ladder of the twenty-second session). The CUDA family's kernel reads 95-101%: one block per token, every 16-byte
load of the token's row issued before the cos / sin table is built. The block kernel does the same in Triton.
Each variant (the loop kernel as shipped before; the block kernel at the production configuration, ``_config``, and
at other tokens-per-program / warps) runs 16384 tokens x 32 heads x 128 bf16 as a CUDA graph of back-to-back
launches after 40 ms of its own work (``gemm_tile_probe``), ROUNDS rounds in turn, beside a device copy of x timed
the same way; every output is compared bit for bit with the loop kernel's (the same expression, elementwise per
token, must give the same bits: the block kernel writes out the fmas that the loop kernel's compile chose, which
the compiler, left to itself, contracted differently in the block shape). Exit status 1 unless the production
configuration's bits equal the loop kernel's, forward and inverse, and it is at least GAIN faster in both.

    python3 scripts/rope_ab.py [OUT.json]
"""

from __future__ import annotations

import json
import math
import statistics
import sys

import torch
import triton
import triton.language as tl

from gradsweep.triton_kernels import rope as R
from gradsweep.triton_kernels._common import to_out

TOKENS, HEADS, HEAD_DIM, THETA = 16384, 32, 128, 1e6
ROUNDS = 5
GAIN = 0.97  # the production block kernel's median over the loop kernel's, at most
BLOCK_CONFIGS = [(tok, w) for tok in (1, 2, 4) for w in (4, 8, 16)]


@triton.jit
def _rope_loop_kernel(x_ptr, pos_ptr, y_ptr, n_rows, HALF, neg_log2_theta_over_half,
                      NH: tl.constexpr, TOK: tl.constexpr, BF: tl.constexpr, INVERSE: tl.constexpr,
                      STAGES: tl.constexpr):
    """The replaced kernel, as it shipped (the tree d1c05962): cos / sin once per [TOK, half], then a loop over
    heads pipelined STAGES deep."""
    r = tl.program_id(0).to(tl.int64) * TOK + tl.arange(0, TOK)
    i = tl.arange(0, BF)
    rmask = r < n_rows
    m = rmask[:, None] & (i < HALF)[None, :]
    pos = tl.load(pos_ptr + r, mask=rmask, other=0).to(tl.float32)
    ang = pos[:, None] * tl.exp2(i.to(tl.float32) * neg_log2_theta_over_half)[None, :]
    c = tl.cos(ang)
    s = tl.sin(ang)
    if INVERSE:
        s = -s
    base = r[:, None] * (NH * 2 * HALF) + i[None, :]
    for h in tl.range(0, NH, num_stages=STAGES):
        off = base + h * (2 * HALF)
        x1 = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + off + HALF, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + off, to_out((x1 * c - x2 * s), y_ptr.dtype.element_ty), mask=m)
        tl.store(y_ptr + off + HALF, to_out((x2 * c + x1 * s), y_ptr.dtype.element_ty), mask=m)


def loop_launch(x: torch.Tensor, pos: torch.Tensor, y: torch.Tensor, inverse: bool) -> None:
    """The replaced launch: 16 tokens a program, 4 warps, 3 stages (its ``_config`` for half = 64)."""
    half = x.shape[2] // 2
    _rope_loop_kernel[(R.cdiv(x.shape[0], 16),)](
        x, pos, y, x.shape[0], half, -math.log2(THETA) / half, NH=x.shape[1], TOK=16, BF=R.pow2(half),
        INVERSE=inverse, STAGES=3, num_warps=4)


def block_launch(x: torch.Tensor, pos: torch.Tensor, y: torch.Tensor, tok: int, warps: int, inverse: bool) -> None:
    """The production kernel at (tok, warps); ``rope_apply``'s arguments otherwise."""
    half = x.shape[2] // 2
    R._rope_kernel[(R.cdiv(x.shape[0], tok),)](
        x, pos, y, x.shape[0], half, -math.log2(THETA) / half, NH=x.shape[1], NHP=R.pow2(x.shape[1]), TOK=tok,
        BF=R.pow2(half), INVERSE=inverse, num_warps=warps)


def main(path: str | None) -> int:
    from scripts.gemm_tile_probe import graph_time_us, heat

    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(TOKENS, HEADS, HEAD_DIM, generator=gen, device="cuda").bfloat16()
    pos = torch.randint(0, 32768, (TOKENS,), generator=gen, device="cuda")
    y = torch.empty_like(x)
    copy_dst = torch.empty_like(x)
    tok0, _, _, warps0 = R._config(HEADS, HEAD_DIM // 2)
    prod = f"block TOK {tok0} w{warps0}"
    variants: dict[tuple, object] = {}
    bits: dict[tuple, bool] = {}
    for inv in (False, True):
        y.fill_(float("nan"))
        loop_launch(x, pos, y, inv)
        ref = y.view(torch.int16).clone()
        variants[(inv, "loop (replaced)")] = lambda i=inv: loop_launch(x, pos, y, i)
        for tok, w in dict.fromkeys([(tok0, warps0), *BLOCK_CONFIGS]):  # the production configuration always
            variants[(inv, f"block TOK {tok} w{w}")] = lambda i=inv, t=tok, ww=w: block_launch(x, pos, y, t, ww, i)
        public = R.rope_apply(x, pos, THETA, inverse=inv)  # the launcher itself: its bits too
        bits[(inv, "rope_apply")] = bool(torch.equal(public.view(torch.int16), ref))
        for key in [k for k in variants if k[0] == inv]:
            y.fill_(float("nan"))
            try:
                variants[key]()
                torch.cuda.synchronize()
            except Exception as exc:  # a configuration that does not compile is not a candidate
                print(f"{key}: {type(exc).__name__}: {exc}"[:200], flush=True)
                del variants[key]
                continue
            bits[key] = bool(torch.equal(y.view(torch.int16), ref))
    copy: list[float] = []
    times: dict[tuple, list[float]] = {k: [] for k in variants}
    for _ in range(ROUNDS):
        heat(lambda: copy_dst.copy_(x))
        copy.append(graph_time_us(lambda: copy_dst.copy_(x)))
        for key, fn in variants.items():
            heat(fn, 40.0)
            times[key].append(graph_time_us(fn))
    c = statistics.median(copy)
    print(f"device {torch.cuda.get_device_name()}; copy of x {c:.1f} us ({2 * x.numel() * 2 / c / 1e3:.0f} GB/s); "
          f"production: {prod}; rope_apply bits equal the loop kernel's: fwd {bits[(False, 'rope_apply')]}, "
          f"inverse {bits[(True, 'rope_apply')]}")
    rows = []
    for key, ts in sorted(times.items(), key=lambda kv: (kv[0][0], statistics.median(kv[1]))):
        med = statistics.median(ts)
        print(f"inverse={key[0]!s:5} {key[1]:18s} {med:7.1f} us (spread {min(ts):.1f}-{max(ts):.1f}), "
              f"{c / med:6.1%} of the copy, bits {'equal' if bits[key] else 'DIFFER'}", flush=True)
        rows.append({"inverse": key[0], "variant": key[1], "us": [round(t, 2) for t in ts],
                     "copy_fraction": round(c / med, 4), "bits_equal": bits[key]})
    ok = True
    for inv in (False, True):
        if (inv, prod) not in times or (inv, "loop (replaced)") not in times:  # one of the two did not run
            print(f"gate inverse={inv}: the production or the loop kernel did not run: FAIL")
            ok = False
            continue
        loop, block = (statistics.median(times[(inv, k)]) for k in ("loop (replaced)", prod))
        good = bits[(inv, prod)] and bits[(inv, "rope_apply")] and block <= GAIN * loop
        print(f"gate inverse={inv}: production {block:.1f} us / loop {loop:.1f} us = {block / loop:.3f} "
              f"(at most {GAIN}), bits {'equal' if bits[(inv, prod)] else 'DIFFER'}: {'PASS' if good else 'FAIL'}")
        ok = ok and good
    if path:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_us": round(c, 2), "production": prod,
                       "rows": rows, "gate": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else None))
