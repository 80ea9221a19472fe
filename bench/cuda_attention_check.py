"""CUDA C++ batch-invariant GQA attention (gradsweep._C) vs torch SDPA on one GPU, in one run: the issue's cases
end to end (host work included) and kernels only (CUDA-graph replay), bitwise layout checks, the FP32-class cost.

Cases (causal, bf16, 32 query heads, 8 K/V heads, head_dim 128):
  prefill 8 x 1024 and 2 x 8192: forward (no grad) and forward + backward (dQ, and dK / dV folded);
  decode: 64 sequences x 1 new token over a 4096-token cache.
Baselines, same run: F.scaled_dot_product_attention with the flash backend and K/V expanded to 32 heads beforehand
(the issue's baseline); with enable_gqa (any backend: what a user writes today); with the expansion inside the
timed region. Decode runs SDPA on the same cache (our store viewed as [64, 4097, 8, 128]).
Checks (production config; exit 1 if any fails): o, dQ, dK, dV of chunked prefill (irregular cuts, reverse and
interleaved backwards), of decode (prefill, then one token per sample per call) and of wide-only programs
(AttnConfig(narrow=False)) equal full prefill bit for bit; inference decode (no grad) o equals the training
forward's; a crafted masked-key signed-zero input gives the same bits in one call and in two, with no -0.
Also timed: fp32_grads off (bf16 P / dS operands, FlashAttention's precision): what FP32-class dK / dV cost.

Usage (repository root, CUDA box, after ``python3 setup.py build_ext --inplace``):
    PYTHONPATH=. python3 bench/cuda_attention_check.py OUT_DIR [--rep-ms 100]
Writes OUT_DIR/cuda_attention_check.json and OUT_DIR/cuda_attention_check.txt (the table, also printed).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels import attention as attn
from gradsweep.cuda_kernels.runtime import cuda_status

HQ, HKV, D = 32, 8, 128
G = HQ // HKV
DEV = "cuda"
START = time.time()
_FLUSH: torch.Tensor | None = None


def _med(fn, rep_ms: float = 100.0) -> float:
    """Median milliseconds of fn() between CUDA events, L2 flushed before each run (do_bench's method)."""
    global _FLUSH
    if _FLUSH is None:
        _FLUSH = torch.empty(256 * 2 ** 20 // 4, dtype=torch.int32, device=DEV)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    est = max((time.perf_counter() - t0) * 1e3 / 5, 1e-3)
    n = int(min(1000, max(10, rep_ms / est)))
    times = []
    for _ in range(n):
        _FLUSH.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(statistics.median(times))


def _graph_ms(fn, rep_ms: float) -> float | str:
    """Median time of a CUDA-graph replay of ``fn`` (its launches only, no host work); a string if capture fails."""
    try:
        fn()
        fn()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return _med(g.replay, rep_ms)
    except Exception as exc:  # report, never hide: the string goes into the JSON
        return f"capture failed: {type(exc).__name__}: {exc}"[:300]


def _rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=g).to(torch.bfloat16)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


# ------------------------------------------------------------------------------------------------ prefill
class Prefill:
    """One prefill shape: inputs, our calls and SDPA's, built once."""

    def __init__(self, batch: int, seq: int, seed: int = 0) -> None:
        self.b, self.s = batch, seq
        n = batch * seq
        self.q, self.do = _rand(n, HQ, D, seed=seed), _rand(n, HQ, D, seed=seed + 1)
        self.k, self.v = _rand(n, HKV, D, seed=seed + 2), _rand(n, HKV, D, seed=seed + 3)
        self.lengths = [seq] * batch
        self.rows = RowIdentity.packed(self.lengths)
        self.flops_fwd = 4.0 * batch * HQ * D * seq * (seq + 1) / 2

    def cache(self, config: attn.AttnConfig = attn.DEFAULT_CONFIG) -> attn.AttentionCache:
        return attn.AttentionCache(self.lengths, HQ, D, DEV, kv_heads=HKV, config=config)

    def fwd(self):
        with torch.no_grad():
            return attn.attention(self.q, self.k, self.v, self.rows, self.cache())

    def fwd_fresh_plan(self):
        with torch.no_grad():  # a new RowIdentity object each call: the plan is built every time (worst case)
            rows = RowIdentity(self.rows.sample.clone(), self.rows.position.clone())
            return attn.attention(self.q, self.k, self.v, rows, self.cache())

    def fwd_bwd(self, config: attn.AttnConfig = attn.DEFAULT_CONFIG):
        q = self.q.detach().requires_grad_(True)
        cache = self.cache(config)
        attn.attention(q, self.k, self.v, self.rows, cache).backward(self.do)
        return q.grad, *cache.finish()

    def fwd_bwd_bf16_grads(self):
        return self.fwd_bwd(attn.AttnConfig(fp32_grads=False))

    def _4d(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.b, self.s, t.shape[1], D).transpose(1, 2)

    def sdpa_setup(self) -> None:
        self.k_exp = self.k.repeat_interleave(G, dim=1)
        self.v_exp = self.v.repeat_interleave(G, dim=1)

    def sdpa_fwd_flash(self):
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(self._4d(self.q), self._4d(self.k_exp), self._4d(self.v_exp),
                                                  is_causal=True)

    def sdpa_fwd_gqa(self):
        with torch.no_grad():
            return F.scaled_dot_product_attention(self._4d(self.q), self._4d(self.k), self._4d(self.v),
                                                  is_causal=True, enable_gqa=True)

    def sdpa_fwd_bwd_flash(self):
        q, k, v = (t.detach().requires_grad_(True) for t in (self.q, self.k_exp, self.v_exp))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(self._4d(q), self._4d(k), self._4d(v), is_causal=True).backward(
                self._4d(self.do))

    def sdpa_fwd_bwd_gqa(self):
        q, k, v = (t.detach().requires_grad_(True) for t in (self.q, self.k, self.v))
        F.scaled_dot_product_attention(self._4d(q), self._4d(k), self._4d(v), is_causal=True,
                                       enable_gqa=True).backward(self._4d(self.do))

    def sdpa_fwd_bwd_flash_expand_inside(self):
        q, k, v = (t.detach().requires_grad_(True) for t in (self.q, self.k, self.v))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            ke, ve = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
            F.scaled_dot_product_attention(self._4d(q), self._4d(ke), self._4d(ve), is_causal=True).backward(
                self._4d(self.do))


# ------------------------------------------------------------------------------------------------ decode
class Decode:
    """64 sequences with a 4096-token cache each, one new token per sequence."""

    def __init__(self, batch: int, past: int, seed: int = 10) -> None:
        self.b, self.past = batch, past
        total = past + 1
        n = batch * total
        self.q, self.k, self.v = _rand(n, HQ, D, seed=seed), _rand(n, HKV, D, seed=seed + 1), \
            _rand(n, HKV, D, seed=seed + 2)
        self.lengths = [total] * batch
        self.cache = attn.AttentionCache(self.lengths, HQ, D, DEV, kv_heads=HKV)
        pre = RowIdentity.packed([past] * batch)
        idx = torch.cat([torch.arange(i * total, i * total + past) for i in range(batch)]).to(DEV)
        with torch.no_grad():
            attn.attention(self.q[idx], self.k[idx], self.v[idx], pre, self.cache)
        self.mark = self.cache.mark()
        last = torch.arange(batch, device=DEV) * total + past
        self.q1, self.k1, self.v1 = self.q[last], self.k[last], self.v[last]
        self.step_rows = RowIdentity.packed([1] * batch, starts=[past] * batch)
        self.bytes = 2.0 * batch * total * HKV * D * 2  # K and V of the cache, read once

    def step(self):
        self.cache.rewind(self.mark)
        with torch.no_grad():
            return attn.attention(self.q1, self.k1, self.v1, self.step_rows, self.cache)

    def _cache4d(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.b, self.past + 1, t.shape[1], D).transpose(1, 2)

    def sdpa_setup(self) -> None:
        self.kc, self.vc = self._cache4d(self.cache.k), self._cache4d(self.cache.v)
        self.q4 = self.q1.view(self.b, 1, HQ, D).transpose(1, 2)

    def sdpa_gqa(self):
        with torch.no_grad():
            return F.scaled_dot_product_attention(self.q4, self.kc, self.vc, enable_gqa=True)

    def sdpa_gqa_flash(self):
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(self.q4, self.kc, self.vc, enable_gqa=True)


# ------------------------------------------------------------------------------------------------ checks
def _cuts(seq: int, sample: int) -> list[int]:
    """Irregular chunk boundaries of one sample (on and off key-block and tile boundaries; differ per sample)."""
    a = (137 * sample + 301) % (seq // 3) + 1
    b = seq // 2 + (97 * sample) % (seq // 4)
    return sorted({0, a, 256 if a < 256 < b else b, b, seq})


def _run_calls(p: Prefill, calls: list[list[tuple[int, int, int]]], schedule: str, grad: bool = True,
               config: attn.AttnConfig = attn.DEFAULT_CONFIG) -> dict[str, torch.Tensor]:
    """Calls of (sample, start, stop) pieces; forward all then backward (reverse) or F0 B0 F1 B1 (interleaved)."""
    cache = p.cache(config)
    o_all, dq_all, pending = torch.zeros_like(p.q), torch.zeros_like(p.q), []
    for pieces in calls:
        idx = torch.cat([torch.arange(s * p.s + a, s * p.s + b) for s, a, b in pieces]).to(DEV)
        rows = RowIdentity.packed([b - a for _, a, b in pieces], [s for s, _, _ in pieces], [a for _, a, _ in pieces])
        q = p.q[idx].detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            o = attn.attention(q, p.k[idx], p.v[idx], rows, cache)
        o_all[idx] = o.detach()
        if grad:
            pending.append((o, q, idx))
            if schedule == "interleaved":
                o.backward(p.do[idx])
    if grad and schedule == "reverse":
        for o, _, idx in reversed(pending):
            o.backward(p.do[idx])
    out = {"o": o_all}
    if grad:
        for _, q, idx in pending:
            dq_all[idx] = q.grad
        out["dq"] = dq_all
        out["dk"], out["dv"] = cache.finish()
    return out


def _check_layouts(p: Prefill, decode_tail: int = 16) -> dict[str, bool]:
    full = _run_calls(p, [[(s, 0, p.s) for s in range(p.b)]], "reverse")
    cuts = [_cuts(p.s, s) for s in range(p.b)]
    n_calls = max(len(c) - 1 for c in cuts)
    chunked = [[(s, c[i], c[i + 1]) for s, c in enumerate(cuts) if i + 1 < len(c)] for i in range(n_calls)]
    prefix = [[(s, 0, p.s - decode_tail) for s in range(p.b)]]
    decode = prefix + [[(s, p.s - decode_tail + i, p.s - decode_tail + i + 1) for s in range(p.b)]
                       for i in range(decode_tail)]
    res = {}
    runs = (("chunked_reverse", chunked, "reverse", attn.DEFAULT_CONFIG),
            ("chunked_interleaved", chunked, "interleaved", attn.DEFAULT_CONFIG),
            ("decode_reverse", decode, "reverse", attn.DEFAULT_CONFIG),
            ("wide_programs_only", [[(s, 0, p.s) for s in range(p.b)]], "reverse", attn.AttnConfig(narrow=False)))
    for name, calls, sched, config in runs:
        got = _run_calls(p, calls, sched, config=config)
        for t in ("o", "dq", "dk", "dv"):
            res[f"{name}.{t}"] = same_bits(got[t], full[t])
    infer = _run_calls(p, decode, "reverse", grad=False)
    res["decode_no_grad.o == training forward"] = same_bits(infer["o"], full["o"])
    return res


def _signed_zero() -> dict[str, object]:
    """Masked keys of a written slot add 0 * (-1) = -0; of an unwritten one 0 * (+0). One call vs two calls."""
    bn = 64
    n, r = 2 * bn, bn + 4
    q = torch.zeros(n, HQ, D, device=DEV)
    q[:, :, 0] = 1.0
    g = torch.Generator(device=DEV).manual_seed(5)
    k = torch.randn(n, HKV, D, device=DEV, generator=g) * 0.1
    k[:, :, 0] = 0.0
    k[bn, :, 0] = 1000.0
    v = torch.randn(n, HKV, D, device=DEV, generator=g)
    v[:bn, :, 0] = -1e-30
    v[bn:r + 1, :, 0] = -0.0
    v[r + 1:, :, 0] = -1.0
    q, k, v = q.bfloat16(), k.bfloat16(), v.bfloat16()

    def run(calls):
        cache = attn.AttentionCache([n], HQ, D, DEV, kv_heads=HKV)
        with torch.no_grad():
            return torch.cat([attn.attention(q[a:b], k[a:b], v[a:b], RowIdentity.packed([b - a], [0], [a]), cache)
                              for a, b in calls])

    one, two = run([(0, n)]), run([(0, r + 1), (r + 1, n)])
    neg = bool(torch.signbit(one[one == 0]).any() or torch.signbit(two[two == 0]).any())
    return {"same_bits": same_bits(one, two), "negative_zero_in_o": neg, "ok": same_bits(one, two) and not neg}


# ------------------------------------------------------------------------------------------------ timing
def _time_prefill(p: Prefill, rep: float) -> dict[str, object]:
    p.sdpa_setup()
    r: dict[str, object] = {"shape": f"{p.b} x {p.s}", "flops_fwd": p.flops_fwd}
    for name, fn in (("ours_fwd", p.fwd), ("ours_fwd_fresh_plan", p.fwd_fresh_plan), ("ours_fwd_bwd", p.fwd_bwd),
                     ("ours_fwd_bwd_bf16_grads", p.fwd_bwd_bf16_grads), ("sdpa_flash_fwd", p.sdpa_fwd_flash),
                     ("sdpa_gqa_fwd", p.sdpa_fwd_gqa), ("sdpa_flash_fwd_bwd", p.sdpa_fwd_bwd_flash),
                     ("sdpa_gqa_fwd_bwd", p.sdpa_fwd_bwd_gqa),
                     ("sdpa_flash_expand_inside_fwd_bwd", p.sdpa_fwd_bwd_flash_expand_inside)):
        try:
            r[f"{name}_ms"] = _med(fn, rep)
        except Exception as exc:
            r[f"{name}_ms"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    for name, fn in (("ours_fwd", p.fwd), ("ours_fwd_bwd", p.fwd_bwd), ("sdpa_flash_fwd", p.sdpa_fwd_flash),
                     ("sdpa_flash_fwd_bwd", p.sdpa_fwd_bwd_flash)):
        r[f"{name}_graph_ms"] = _graph_ms(fn, rep)
    for ours, base in (("ours_fwd", "sdpa_flash_fwd"), ("ours_fwd_bwd", "sdpa_flash_fwd_bwd"),
                       ("ours_fwd_bwd_bf16_grads", "sdpa_flash_fwd_bwd"),
                       ("ours_fwd_graph", "sdpa_flash_fwd_graph"), ("ours_fwd_bwd_graph", "sdpa_flash_fwd_bwd_graph")):
        a, b = r.get(f"{ours}_ms"), r.get(f"{base}_ms")
        if isinstance(a, float) and isinstance(b, float):
            r[f"ratio_{ours}"] = a / b
    if isinstance(r.get("ours_fwd_ms"), float):
        r["ours_fwd_tflops"] = p.flops_fwd / r["ours_fwd_ms"] / 1e9
    return r


def _time_decode(dc: Decode, rep: float) -> dict[str, object]:
    dc.sdpa_setup()
    r: dict[str, object] = {"shape": f"{dc.b} x 1 over {dc.past}", "bytes_kv": dc.bytes}
    for name, fn in (("ours", dc.step), ("sdpa_gqa", dc.sdpa_gqa), ("sdpa_gqa_flash", dc.sdpa_gqa_flash)):
        try:
            r[f"{name}_ms"] = _med(fn, rep)
        except Exception as exc:
            r[f"{name}_ms"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    same_cache = [r[k] for k in ("sdpa_gqa_ms", "sdpa_gqa_flash_ms") if isinstance(r[k], float)]
    if isinstance(r["ours_ms"], float) and same_cache:
        r["ratio_vs_best_sdpa_same_cache"] = r["ours_ms"] / min(same_cache)
        r["ours_gbps"] = dc.bytes / r["ours_ms"] / 1e6
    return r


def _ceilings() -> dict[str, float]:
    """The run's own copy bandwidth and bf16 matmul rate."""
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV).normal_()
    y = torch.empty_like(x)
    copy_ms = _med(lambda: y.copy_(x), 50)
    a, b = _rand(8192, 8192, seed=90), _rand(8192, 8192, seed=91)
    mm_ms = _med(lambda: a @ b, 50)
    return {"copy_GBps": 2 * 2 ** 30 / copy_ms / 1e6, "bf16_matmul_TFLOPs": 2 * 8192 ** 3 / mm_ms / 1e9}


def _table(res: dict) -> list[str]:
    def f(x) -> str:
        return f"{x:.3f}" if isinstance(x, float) else str(x)[:40]

    lines = []
    for key in ("prefill_8x1024", "prefill_2x8192"):
        r = res.get(key)
        if not isinstance(r, dict):
            continue
        lines.append(f"{key}: fwd ours {f(r.get('ours_fwd_ms'))} ms / sdpa flash {f(r.get('sdpa_flash_fwd_ms'))} "
                     f"(gqa {f(r.get('sdpa_gqa_fwd_ms'))}) = {f(r.get('ratio_ours_fwd'))}x (target 1.5x); kernels "
                     f"{f(r.get('ours_fwd_graph_ms'))}/{f(r.get('sdpa_flash_fwd_graph_ms'))} = "
                     f"{f(r.get('ratio_ours_fwd_graph'))}x; fresh plan {f(r.get('ours_fwd_fresh_plan_ms'))} ms")
        lines.append(f"{key}: fwd+bwd ours {f(r.get('ours_fwd_bwd_ms'))} ms / sdpa flash "
                     f"{f(r.get('sdpa_flash_fwd_bwd_ms'))} (gqa {f(r.get('sdpa_gqa_fwd_bwd_ms'))}) = "
                     f"{f(r.get('ratio_ours_fwd_bwd'))}x (target 1.5x); kernels {f(r.get('ours_fwd_bwd_graph_ms'))}/"
                     f"{f(r.get('sdpa_flash_fwd_bwd_graph_ms'))} = {f(r.get('ratio_ours_fwd_bwd_graph'))}x; "
                     f"bf16 grads {f(r.get('ours_fwd_bwd_bf16_grads_ms'))} ms = "
                     f"{f(r.get('ratio_ours_fwd_bwd_bf16_grads'))}x")
    r = res.get("decode_64x4096")
    if isinstance(r, dict):
        lines.append(f"decode 64x1/4096: ours {f(r.get('ours_ms'))} ms ({f(r.get('ours_gbps'))} GB/s) / sdpa gqa "
                     f"{f(r.get('sdpa_gqa_ms'))} (flash {f(r.get('sdpa_gqa_flash_ms'))}) = "
                     f"{f(r.get('ratio_vs_best_sdpa_same_cache'))}x")
    lines.append(f"ceilings: {res.get('ceilings')}")
    failed = res.get("failed_checks")
    lines.append(f"checks: {'PASS' if failed == [] else 'FAIL ' + str(failed)}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--rep-ms", type=float, default=100.0, help="time spent per measurement")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    res: dict[str, object] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "host": platform.node(), "status": cuda_status()[1], "config": str(attn.DEFAULT_CONFIG),
                              "heads": HQ, "kv_heads": HKV, "head_dim": D}

    def save() -> None:
        (args.out_dir / "cuda_attention_check.json").write_text(json.dumps(res, indent=1, default=str))
        (args.out_dir / "cuda_attention_check.txt").write_text("\n".join(_table(res)) + "\n")

    try:
        res["ceilings"] = _ceilings()
        p8 = Prefill(8, 1024)
        checks = _check_layouts(p8)
        checks["signed_zero.ok"] = bool(_signed_zero()["ok"])
        res["checks_8x1024"] = checks
        save()
        p2 = Prefill(2, 8192, seed=20)
        res["checks_2x8192"] = _check_layouts(p2, decode_tail=4)
        res["failed_checks"] = [f"{shape}:{k}" for shape in ("checks_8x1024", "checks_2x8192")
                                for k, ok in res[shape].items() if not ok]  # type: ignore[union-attr]
        save()
        for key, p in (("prefill_8x1024", p8), ("prefill_2x8192", p2)):
            res[key] = _time_prefill(p, args.rep_ms)
            save()
        del p8, p2
        torch.cuda.empty_cache()
        res["decode_64x4096"] = _time_decode(Decode(64, 4096), args.rep_ms)
    except Exception:  # keep what was measured, then fail loudly
        res["error"] = traceback.format_exc()[-3000:]
        save()
        print(res["error"], file=sys.stderr)
        return 1
    res["wall_s"] = time.time() - START
    save()
    print("\n".join(_table(res)), flush=True)
    return 1 if res["failed_checks"] else 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("cuda_attention_check: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    ok, why = cuda_status()
    if not ok:
        print(f"cuda_attention_check: {why}", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main())
