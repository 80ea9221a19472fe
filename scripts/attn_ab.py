"""The CUDA C++ attention's two wide kernels side by side, forward and dQ: the mma.sync programs
(csrc/attention_fwd.cu, attention_dq.cu) and the wgmma ones (attention_fwd_sm90.cu, attention_dq_sm90.cu; Hopper),
on the same call's programs, against flash SDPA's forward at the same shape. Bits compared (o and lse; dq and
delta), device time by CUDA events around back-to-back launches (kernels only: the plan is built once). A
diagnostic for the kernel notes, not a benchmark: `gradsweep bench --op attention` is that.

    PYTHONPATH=. python3 scripts/attn_ab.py OUT.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels import attention as attn
from gradsweep.harness.compare import raw_bits

HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # the release shape (Qwen3-8B)
CASES = {"2x8192": [8192] * 2, "8x1024": [1024] * 8, "1x2048": [2048]}


def device_us(fn, rounds: int = 7, min_ms: float = 20.0) -> float:
    """Median over rounds of the mean time per call of back-to-back calls (each round >= min_ms)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    reps = max(1, int(min_ms / max(start.elapsed_time(end), 1e-3)))
    samples = []
    for _ in range(rounds):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(samples)


def captured_call(lengths: list[int], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  do: torch.Tensor) -> tuple[dict, dict]:
    """One packed training call through the public API, the launch arguments of its forward and its dQ kept."""
    cache = attn.AttentionCache(lengths, HEADS, HEAD_DIM, q.device, kv_heads=KV_HEADS)
    rows = RowIdentity.packed(lengths, list(range(len(lengths))), [0] * len(lengths))
    fwd: dict = {}
    bwd: dict = {}
    real_fwd, real_dq = attn._launch_fwd, attn._launch_dq

    def keep_fwd(q_, o_, plan_, cache_, path=0):
        fwd.update(args=(q_, o_, plan_, cache_))
        real_fwd(q_, o_, plan_, cache_, path)

    def keep_dq(q_, o_, do_, dq_, plan_, cache_, path=0):
        bwd.update(args=(q_, o_, do_, dq_, plan_, cache_))
        real_dq(q_, o_, do_, dq_, plan_, cache_, path)

    attn._launch_fwd, attn._launch_dq = keep_fwd, keep_dq
    try:
        qg = q.detach().requires_grad_(True)
        attn.attention(qg, k, v, rows, cache).backward(do)
        cache.finish()
    finally:
        attn._launch_fwd, attn._launch_dq = real_fwd, real_dq
    return fwd, bwd


def ab(launch, args: tuple, outputs: list[torch.Tensor]) -> tuple[bool, dict]:
    """Both paths on the same arguments from zeroed outputs: (bits equal, per-path device time)."""
    got = {}
    for path in (1, 2):
        for t in outputs:
            t.zero_()
        launch(*args, path)
        torch.cuda.synchronize()
        got[path] = [t.clone() for t in outputs]
    equal = all(torch.equal(raw_bits(a), raw_bits(b)) for a, b in zip(got[1], got[2]))
    return equal, {p: device_us(lambda p=p: launch(*args, p)) for p in (1, 2)}


def run_case(name: str, lengths: list[int]) -> dict:
    n = sum(lengths)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(n, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    k, v = (torch.randn(n, KV_HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16() for _ in range(2))
    do = torch.randn(n, HEADS, HEAD_DIM, device="cuda", generator=g).bfloat16()
    fwd, bwd = captured_call(lengths, q, k, v, do)
    _, o, plan, cache = fwd["args"]
    fwd_equal, fwd_us = ab(attn._launch_fwd, fwd["args"], [o, cache.lse])
    dq_equal, dq_us = ab(attn._launch_dq, bwd["args"], [bwd["args"][3], cache.delta])
    times = {"path1_us": fwd_us[1], "path2_us": fwd_us[2], "dq_path1_us": dq_us[1], "dq_path2_us": dq_us[2]}
    b, s = len(lengths), lengths[0]
    if all(x == s for x in lengths):
        qs = q.view(b, s, HEADS, HEAD_DIM).transpose(1, 2)
        ks, vs = (t.view(b, s, KV_HEADS, HEAD_DIM).repeat_interleave(HEADS // KV_HEADS, dim=2).transpose(1, 2)
                  for t in (k, v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
            times["sdpa_flash_us"] = device_us(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True))
    flops = sum(4.0 * x * (x + 1) / 2 * HEAD_DIM * HEADS for x in lengths)  # dQ: S, dP and dS K, 1.5x of it
    row = {"case": name, "lengths": lengths, "bits_equal": fwd_equal and dq_equal, "fwd_bits_equal": fwd_equal,
           "dq_bits_equal": dq_equal, **times, "wide_programs": int(plan.fwd.wide.shape[0]),
           "narrow_programs": int(plan.fwd.narrow.shape[0]), "dq_wide_programs": int(plan.dq.wide.shape[0])}
    for key in [k for k in times]:
        work = 1.5 * flops if key.startswith("dq_") else flops
        row[key.replace("_us", "_tflops")] = work / (times[key] * 1e-6) / 1e12
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    rows = [run_case(name, lengths) for name, lengths in CASES.items()]
    for r in rows:
        ref = r.get("sdpa_flash_us")
        extra = f", flash SDPA {ref:.1f} us (wgmma / SDPA {r['path2_us'] / ref:.2f}x)" if ref else ""
        print(f"{r['case']}: mma.sync {r['path1_us']:.1f} us ({r['path1_tflops']:.0f} TFLOP/s), wgmma "
              f"{r['path2_us']:.1f} us ({r['path2_tflops']:.0f} TFLOP/s), {r['path1_us'] / r['path2_us']:.2f}x"
              f"{extra}; bits {'equal' if r['fwd_bits_equal'] else 'DIFFER'}")
        print(f"{r['case']} dQ: mma.sync {r['dq_path1_us']:.1f} us ({r['dq_path1_tflops']:.0f} TFLOP/s), wgmma "
              f"{r['dq_path2_us']:.1f} us ({r['dq_path2_tflops']:.0f} TFLOP/s), "
              f"{r['dq_path1_us'] / r['dq_path2_us']:.2f}x; bits {'equal' if r['dq_bits_equal'] else 'DIFFER'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": rows}, indent=1))
    raise SystemExit(0 if all(r["bits_equal"] for r in rows) else 1)


if __name__ == "__main__":
    main()
