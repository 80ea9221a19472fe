"""A/B on the H200: dX (pointer vs TMA GEMM), linear_logp forward (pointer vs TMA, configs) and dlogits (pointer vs
TMA) against cuBLAS in the same process, with the bits of each pair compared. (The script of the 11:50 call, laid
out for the linter afterwards: same shapes, same calls, same order.)

    PYTHONPATH=. python3 bench/results/tma_vocab_2026-12-03/ab_fwd.py OUT.txt
"""

from __future__ import annotations

import sys

import torch
import triton

from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels import linear_logp as ll

K, V = 4096, 151936


def bits(a: torch.Tensor) -> torch.Tensor:
    return a.view(torch.int32) if a.dtype == torch.float32 else a.view(torch.int16)


def t_ms(fn, rep: int = 100) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def dx_ab(say, m: int, n_out: int) -> None:
    dy = torch.randn(m, n_out, device="cuda").bfloat16()
    wt = (torch.randn(n_out, 4096, device="cuda") * .02).bfloat16()
    cub = t_ms(lambda: dy @ wt)
    tma = gemm.matmul_invariant(dy, wt.t())
    ms_t = t_ms(lambda: gemm.matmul_invariant(dy, wt.t()))
    keep = gemm.TMA_MIN_M
    gemm.TMA_MIN_M = 10 ** 9  # the pointer kernel at every M
    ptr = gemm.matmul_invariant(dy, wt.t())
    ms_p = t_ms(lambda: gemm.matmul_invariant(dy, wt.t()))
    gemm.TMA_MIN_M = keep
    say(f"dX M={m} N_out={n_out} K_in=4096: cuBLAS {cub:.3f} ms, pointer {ms_p:.3f} ({ms_p / cub:.3f}x), "
        f"tma {ms_t:.3f} ({ms_t / cub:.3f}x), bits equal {torch.equal(bits(tma), bits(ptr))}")


def vocab_ab(say, g: torch.Generator, w: torch.Tensor, t_rows: int) -> None:
    base = dict(ll.FWD_CFG)
    variants = {"base": base, "s4": {**base, "num_stages": 4}, "vc4096": {**base, "VCHUNK": 4096}}
    h = torch.randn(t_rows, K, device="cuda", generator=g).bfloat16()
    t = torch.randint(0, V, (t_rows,), device="cuda", generator=g)
    cub = t_ms(lambda: h @ w.T)
    say(f"T={t_rows} cuBLAS lm_head GEMM {cub:.3f} ms")
    ref = ll.fused_forward(h, w, t, tma=False)
    ptr_ms = t_ms(lambda: ll.fused_forward(h, w, t, tma=False))
    say(f"  pointer base {ptr_ms:.3f} ms ({t_ms(lambda: ll.fused_forward(h, w, t, tma=False)) / cub:.3f}x)")
    for name, cfg in variants.items():
        try:
            got = ll.fused_forward(h, w, t, cfg=cfg, tma=True)
            same = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref))
            ms = t_ms(lambda cfg=cfg: ll.fused_forward(h, w, t, cfg=cfg, tma=True))
            say(f"  tma {name} {ms:.3f} ms ({ms / cub:.3f}x) bits==pointer base: {same}")
        except Exception as e:  # a configuration that does not fit: reported, the others go on
            say(f"  tma {name} failed: {e!r}"[:300])
    lse, gg, wc = ref[1], torch.randn(t_rows, device="cuda", generator=g), w[:8192]  # one backward chunk
    cubc = t_ms(lambda: h @ wc.T)
    d0 = ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=False)
    d1 = ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=True)
    ptr_c = t_ms(lambda: ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=False))
    tma_c = t_ms(lambda: ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=True))
    say(f"  dlogits chunk: cuBLAS {cubc:.3f} ms, pointer {ptr_c:.3f}, tma {tma_c:.3f}; "
        f"bits equal {torch.equal(bits(d0), bits(d1))}")
    say(f"  tuner timings {ll._DLOGITS_TMA.timings} / {ll._DLOGITS.timings}")


def main() -> None:
    out = open(sys.argv[1], "a")

    def say(text: str) -> None:
        print(text, flush=True)
        out.write(text + "\n")
        out.flush()

    for m in (4096, 16384):
        for n_out in (4096, 14336):
            dx_ab(say, m, n_out)
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(V, K, device="cuda", generator=g) * 0.02).bfloat16()
    for t_rows in (4096, 16384):
        vocab_ab(say, g, w, t_rows)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
