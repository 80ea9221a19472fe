"""Triton batch-invariant attention vs torch SDPA on a GPU: forward, forward+backward, one chunked
prefill step and a decode step; bitwise check that chunked prefill equals the full-prefill rows.

Usage (CUDA box): PYTHONPATH=. python3 bench/bench_attention.py --out attention.json
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F
import triton.testing as tt

from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels import attention as attn


def _med(fn) -> float:
    return tt.do_bench(fn, warmup=10, rep=100, return_mode="median")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="attention.json")
    args = ap.parse_args()
    b, s, h, d = 8, 1024, 32, 128
    q, k, v, do = (torch.randn(b * s, h, d, device="cuda").to(torch.bfloat16) for _ in range(4))
    lengths = [s] * b
    rows = RowIdentity.packed(lengths)
    flops_fwd = 4 * b * h * d * s * s / 2  # causal

    def ours_fwd():
        return attn.attention(q, k, v, rows, attn.AttentionCache(lengths, h, d, "cuda"))

    def ours_fwd_bwd():
        qq = q.detach().requires_grad_(True)
        cache = attn.AttentionCache(lengths, h, d, "cuda")
        attn.attention(qq, k, v, rows, cache).backward(do)
        cache.finish()

    def sdpa(t):
        return t.view(b, s, h, d).transpose(1, 2)

    def sdpa_fwd():
        return F.scaled_dot_product_attention(sdpa(q), sdpa(k), sdpa(v), is_causal=True)

    def sdpa_fwd_bwd():
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        F.scaled_dot_product_attention(sdpa(qq), sdpa(kk), sdpa(vv), is_causal=True).backward(sdpa(do))

    res = {}
    for name, ours, ref in (("fwd", ours_fwd, sdpa_fwd), ("fwd+bwd", ours_fwd_bwd, sdpa_fwd_bwd)):
        t_o, t_r = _med(ours), _med(ref)
        res[name] = {"ours_ms": t_o, "sdpa_ms": t_r, "ratio": t_o / t_r}
        print(f"attention {name:8s} B={b} S={s} H={h} D={d} causal: ours {t_o:.3f} ms, SDPA {t_r:.3f} ms, "
              f"ratio {t_o / t_r:.2f}" + (f", ours {flops_fwd / t_o / 1e9:.0f} TFLOP/s" if name == "fwd" else ""),
              flush=True)

    # chunked prefill (two calls) must give the rows of full prefill, bit for bit
    full = ours_fwd()
    cache = attn.AttentionCache(lengths, h, d, "cuda")
    half = RowIdentity.packed([s // 2] * b, starts=[0] * b)
    rest = RowIdentity.packed([s - s // 2] * b, starts=[s // 2] * b)
    idx0 = torch.cat([torch.arange(i * s, i * s + s // 2) for i in range(b)]).cuda()
    idx1 = torch.cat([torch.arange(i * s + s // 2, (i + 1) * s) for i in range(b)]).cuda()
    o0 = attn.attention(q[idx0], k[idx0], v[idx0], half, cache)
    o1 = attn.attention(q[idx1], k[idx1], v[idx1], rest, cache)
    same = bool(torch.equal(full[idx0].view(torch.int16), o0.view(torch.int16))
                and torch.equal(full[idx1].view(torch.int16), o1.view(torch.int16)))
    print(f"{'PASS' if same else 'FAIL'} chunked prefill (2 calls) rows == full prefill rows, bitwise", flush=True)
    res["chunked_equals_full"] = same
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
