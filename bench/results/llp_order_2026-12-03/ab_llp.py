"""A/B on the H200: linear_logp forward program order and vocabulary chunk (VCHUNK 2048 rows-fastest = the old
order, VCHUNK 2048 grouped, VCHUNK 256/512 grouped) against one cuBLAS lm_head GEMM; R-invariance and TMA = pointer
bits of each variant."""
import sys

import torch
import triton

from gradsweep.triton_kernels import linear_logp as ll

out = open(sys.argv[1], "a")
def say(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    out.write(s + "\n")
    out.flush()
def bits(a): return a.view(torch.int32)
def t_ms(fn, rep=200):
    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")
K, V = 4096, 151936
g = torch.Generator(device="cuda").manual_seed(0)
w = (torch.randn(V, K, device="cuda", generator=g) * 0.02).bfloat16()
new = dict(ll.FWD_CFG)
say("default FWD_CFG", new)
variants = {
    "old vc2048 rows-fastest": {**new, "VCHUNK": 2048, "GROUP_M": 1 << 20},
    "vc2048 g8": {**new, "VCHUNK": 2048, "GROUP_M": 8},
    "vc512 g8": {**new, "VCHUNK": 512, "GROUP_M": 8},
    "new vc256 g8 (default)": new,
    "vc256 g16": {**new, "GROUP_M": 16},
    "vc256 g4": {**new, "GROUP_M": 4},
    "vc256 g8 s4": {**new, "num_stages": 4},
}
hs = {}
for T in (4096, 16384):
    h = (torch.randn(T, K, device="cuda", generator=g)).bfloat16()
    t = torch.randint(0, V, (T,), device="cuda", generator=g)
    hs[T] = (h, t)
    cub = t_ms(lambda h=h: h @ w.T)
    say(f"T={T} cuBLAS lm_head GEMM {cub:.3f} ms")
    for name, cfg in variants.items():
        for tma in (True, False) if name.startswith("new") or name.startswith("old") else (True,):
            try:
                got = ll.fused_forward(h, w, t, cfg=cfg, tma=tma)
                ms = t_ms(lambda cfg=cfg, tma=tma, h=h, t=t: ll.fused_forward(h, w, t, cfg=cfg, tma=tma))
                # R-invariance: rows of sub-batches (1, 37, 1000 rows at offsets) equal the whole call's rows
                inv = True
                for a, b in ((0, 1), (5, 42), (T - 1000, T)):
                    sub = ll.fused_forward(h[a:b], w, t[a:b], cfg=cfg, tma=tma)
                    inv &= all(torch.equal(bits(x), bits(y[a:b])) for x, y in zip(sub, got))
                line = f"  {name} {'tma' if tma else 'ptr'} {ms:.3f} ms ({ms / cub:.3f}x) R-invariant {inv}"
                if not tma:
                    ref = ll.fused_forward(h, w, t, cfg=cfg, tma=True)
                    line += f" tma==ptr {all(torch.equal(bits(x), bits(y)) for x, y in zip(ref, got))}"
                say(line)
            except Exception as e:
                say(f"  {name} failed: {e!r}"[:300])
    if T == 16384:
        old = ll.fused_forward(h, w, t, cfg=variants["old vc2048 rows-fastest"], tma=True)
        cur = ll.fused_forward(h, w, t, tma=True)
        d = (old[0] - cur[0]).abs().max().item()
        say(f"  old vs new logp: max |diff| {d:.3e}, equal bits {torch.equal(bits(old[0]), bits(cur[0]))}")
    del h
    torch.cuda.empty_cache()
# accuracy of the new order against an fp32 reference on 512 rows
h, t = hs[4096]
h, t = h[:512], t[:512]
ref = torch.log_softmax(h.float() @ w.float().T, -1).gather(1, t[:, None])[:, 0]
for name in ("old vc2048 rows-fastest", "new vc256 g8 (default)"):
    lp = ll.fused_forward(h, w, t, cfg=variants[name], tma=True)[0]
    say(f"  {name}: max |logp - fp32 ref| {(lp - ref).abs().max().item():.3e}")
