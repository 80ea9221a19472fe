"""A/B on the H200: linear_logp forward (pointer vs TMA, configs) and dlogits (pointer vs TMA) against cuBLAS; bits."""
import sys, time
import torch, triton
from gradsweep.triton_kernels import linear_logp as ll
out = open(sys.argv[1], "a")
def say(*a):
    s = " ".join(str(x) for x in a); print(s, flush=True); out.write(s + "\n"); out.flush()
def bits(a): return a.view(torch.int32) if a.dtype == torch.float32 else a.view(torch.int16)
def t_ms(fn, rep=100):
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")
from gradsweep.triton_kernels import gemm
for M in (4096, 16384):
    for n_out in (4096, 14336):
        dy = torch.randn(M, n_out, device="cuda").bfloat16(); wt = (torch.randn(n_out, 4096, device="cuda") * .02).bfloat16()
        cub = t_ms(lambda: dy @ wt)
        tma = gemm.matmul_invariant(dy, wt.t()); ms_t = t_ms(lambda: gemm.matmul_invariant(dy, wt.t()))
        keep = gemm.TMA_MIN_M; gemm.TMA_MIN_M = 10 ** 9
        ptr = gemm.matmul_invariant(dy, wt.t()); ms_p = t_ms(lambda: gemm.matmul_invariant(dy, wt.t()))
        gemm.TMA_MIN_M = keep
        say(f"dX M={M} N_out={n_out} K_in=4096: cuBLAS {cub:.3f} ms, pointer {ms_p:.3f} ({ms_p/cub:.3f}x), "
            f"tma {ms_t:.3f} ({ms_t/cub:.3f}x), bits equal {torch.equal(bits(tma), bits(ptr))}")
        del dy, wt
K, V = 4096, 151936
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(V, K, device="cuda", generator=g) * 0.02).bfloat16()
base = dict(ll.FWD_CFG)
variants = {"base": base, "s4": {**base, "num_stages": 4}, "vc4096": {**base, "VCHUNK": 4096}}
for T in (4096, 16384):
    h = (torch.randn(T, K, device="cuda", generator=g)).bfloat16()
    t = torch.randint(0, V, (T,), device="cuda", generator=g)
    cub = t_ms(lambda: h @ w.T)
    say(f"T={T} cuBLAS lm_head GEMM {cub:.3f} ms")
    ref = ll.fused_forward(h, w, t, tma=False)
    say(f"  pointer base {t_ms(lambda: ll.fused_forward(h, w, t, tma=False)):.3f} ms "
        f"({t_ms(lambda: ll.fused_forward(h, w, t, tma=False)) / cub:.3f}x)")
    for name, cfg in variants.items():
        try:
            got = ll.fused_forward(h, w, t, cfg=cfg, tma=True)
            same = all(torch.equal(bits(a), bits(b)) for a, b in zip(got, ref))
            ms = t_ms(lambda cfg=cfg: ll.fused_forward(h, w, t, cfg=cfg, tma=True))
            say(f"  tma {name} {ms:.3f} ms ({ms / cub:.3f}x) bits==pointer base: {same}")
        except Exception as e:
            say(f"  tma {name} failed: {e!r}"[:300])
    # dlogits, one backward chunk of 8192 columns
    lse = ref[1]; gg = torch.randn(T, device="cuda", generator=g)
    wc = w[:8192]
    cubc = t_ms(lambda: h @ wc.T)
    d0 = ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=False)
    d1 = ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=True)
    say(f"  dlogits chunk: cuBLAS {cubc:.3f} ms, pointer {t_ms(lambda: ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=False)):.3f}"
        f", tma {t_ms(lambda: ll.dlogits_chunk(h, wc, t, lse, gg, 0, V, tma=True)):.3f}; bits equal {torch.equal(bits(d0), bits(d1))}")
    say(f"  tuner timings {ll._DLOGITS_TMA.timings} / {ll._DLOGITS.timings}")
    del h
    torch.cuda.empty_cache()
