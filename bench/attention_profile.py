"""Where attention's time goes on a GPU: wall time per call, and a torch.profiler table per case (our kernels,
the store scatter, allocations, vs host time), for the issue's shapes (32 query heads, 8 K/V heads, d 128).

Usage (repository root, CUDA box): PYTHONPATH=. python3 bench/attention_profile.py [OUT_DIR]
Writes OUT_DIR/attention_profile.txt when OUT_DIR is given.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels import attention as attn

HQ, HKV, D = 32, 8, 128


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(torch.bfloat16)


def _prefill(batch: int, seq: int):
    q, do = _rand(batch * seq, HQ, D), _rand(batch * seq, HQ, D)
    k, v = _rand(batch * seq, HKV, D), _rand(batch * seq, HKV, D)
    lengths = [seq] * batch
    rows = RowIdentity.packed(lengths)

    def cache() -> attn.AttentionCache:
        return attn.AttentionCache(lengths, HQ, D, "cuda", kv_heads=HKV)

    def fwd() -> None:
        with torch.no_grad():
            attn.attention(q, k, v, rows, cache())

    def fwd_bwd() -> None:
        qq = q.detach().requires_grad_(True)
        c = cache()
        attn.attention(qq, k, v, rows, c).backward(do)
        c.finish()

    return fwd, fwd_bwd


def _decode(batch: int = 64, past: int = 4096):
    total = past + 1
    q, k, v = _rand(batch * total, HQ, D), _rand(batch * total, HKV, D), _rand(batch * total, HKV, D)
    cache = attn.AttentionCache([total] * batch, HQ, D, "cuda", kv_heads=HKV)
    idx = torch.cat([torch.arange(i * total, i * total + past) for i in range(batch)]).cuda()
    with torch.no_grad():
        attn.attention(q[idx], k[idx], v[idx], RowIdentity.packed([past] * batch), cache)
    mark = cache.mark()
    last = torch.arange(batch, device="cuda") * total + past
    rows = RowIdentity.packed([1] * batch, starts=[past] * batch)

    def step() -> None:
        cache.rewind(mark)
        with torch.no_grad():
            attn.attention(q[last], k[last], v[last], rows, cache)

    return step


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    f8, fb8 = _prefill(8, 1024)
    f2, fb2 = _prefill(2, 8192)
    cases = {"fwd 8x1024": f8, "fwd+bwd 8x1024": fb8, "fwd 2x8192": f2, "fwd+bwd 2x8192": fb2,
             "decode 64x1/4096": _decode()}
    text = []
    for name, fn in cases.items():
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
        text.append(f"== {name}: wall {wall:.3f} ms per call")
        text.append(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=60))
    print("\n".join(text), flush=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "attention_profile.txt").write_text("\n".join(text))


if __name__ == "__main__":
    main()
