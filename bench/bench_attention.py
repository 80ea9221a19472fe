"""Triton batch-invariant GQA attention vs torch SDPA on one GPU, in one run: the issue's cases end to end (host
work included) and kernels only (CUDA-graph replay), bitwise checks of full vs chunked prefill vs decode, and a
launch-config sweep within a time budget.

Cases (causal, bf16, 32 query heads, 8 K/V heads, head_dim 128):
  prefill 8 x 1024 and 2 x 8192: forward (no grad) and forward + backward (dQ, and dK / dV folded);
  decode: 64 sequences x 1 new token over a 4096-token cache.
Baselines, same run: F.scaled_dot_product_attention with the flash backend and K/V expanded to 32 heads
beforehand (the issue's baseline); with enable_gqa (any backend; what a user writes today); with the expansion
inside the timed region. Decode runs SDPA on the same cache (our store viewed as [64, 4097, 8, 128]).
Checks (production config; exit 1 if any fails): o, dQ, dK, dV of chunked prefill (irregular cuts, reverse and
interleaved backwards) and of decode (prefill, then one token per sample per call) equal full prefill bit for
bit; inference decode (no grad) o equals the training forward's; a crafted masked-key signed-zero input gives
the same bits in one call and in two, with no -0. Config variants run the same checks (exit 3 if only a
variant fails).

Usage (repository root, CUDA box): PYTHONPATH=. python3 bench/bench_attention.py OUT_DIR [--budget-s 420]
Writes OUT_DIR/attention_h200.json; prints a table last.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels import attention as attn
from gradsweep.triton_kernels._common import same_bits

HQ, HKV, D = 32, 8, 128
G = HQ // HKV
DEV = "cuda"
START = time.time()


def _med(fn, rep: int = 100) -> float:
    return float(tt.do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def _rand(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randn(*shape, device=DEV, generator=g).to(torch.bfloat16)


def _graph_ms(fn, rep: int = 100) -> float | str:
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
        return _med(g.replay, rep)
    except Exception as exc:  # report, never hide: the string goes into the JSON
        return f"capture failed: {type(exc).__name__}: {exc}"[:300]


# ------------------------------------------------------------------------------------------------ prefill
class Prefill:
    """One prefill shape: inputs, our calls and SDPA's, built once."""

    def __init__(self, batch: int, seq: int, config: attn.AttnConfig, seed: int = 0) -> None:
        self.b, self.s, self.cfg = batch, seq, config
        n = batch * seq
        self.q, self.do = _rand(n, HQ, D, seed=seed), _rand(n, HQ, D, seed=seed + 1)
        self.k, self.v = _rand(n, HKV, D, seed=seed + 2), _rand(n, HKV, D, seed=seed + 3)
        self.lengths = [seq] * batch
        self.rows = RowIdentity.packed(self.lengths)
        self.flops_fwd = 4.0 * batch * HQ * D * seq * (seq + 1) / 2

    def cache(self, config: attn.AttnConfig | None = None) -> attn.AttentionCache:
        return attn.AttentionCache(self.lengths, HQ, D, DEV, kv_heads=HKV, config=config or self.cfg)

    # ours
    def fwd(self):
        with torch.no_grad():
            return attn.attention(self.q, self.k, self.v, self.rows, self.cache())

    def fwd_fresh_plan(self):
        with torch.no_grad():  # a new RowIdentity object each call: the plan is built every time (worst case)
            rows = RowIdentity(self.rows.sample.clone(), self.rows.position.clone())
            return attn.attention(self.q, self.k, self.v, rows, self.cache())

    def fwd_bwd(self):
        q = self.q.detach().requires_grad_(True)
        cache = self.cache()
        attn.attention(q, self.k, self.v, self.rows, cache).backward(self.do)
        return q.grad, *cache.finish()

    # SDPA
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

    def sdpa_fwd_flash_expand_inside(self):
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            k, v = self.k.repeat_interleave(G, dim=1), self.v.repeat_interleave(G, dim=1)
            return F.scaled_dot_product_attention(self._4d(self.q), self._4d(k), self._4d(v), is_causal=True)

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

    def __init__(self, batch: int, past: int, config: attn.AttnConfig, seed: int = 10) -> None:
        self.b, self.past, self.cfg = batch, past, config
        total = past + 1
        n = batch * total
        self.q, self.k, self.v = _rand(n, HQ, D, seed=seed), _rand(n, HKV, D, seed=seed + 1), \
            _rand(n, HKV, D, seed=seed + 2)
        self.lengths = [total] * batch
        self.cache = attn.AttentionCache(self.lengths, HQ, D, DEV, kv_heads=HKV, config=config)
        pre = RowIdentity.packed([past] * batch)
        idx = torch.cat([torch.arange(i * total, i * total + past) for i in range(batch)]).to(DEV)
        with torch.no_grad():
            attn.attention(self.q[idx], self.k[idx], self.v[idx], pre, self.cache)
        self.mark = self.cache.mark()
        self.last = torch.arange(batch, device=DEV) * total + past
        self.q1, self.k1, self.v1 = self.q[self.last], self.k[self.last], self.v[self.last]
        self.step_rows = RowIdentity.packed([1] * batch, starts=[past] * batch)
        self.flops = 4.0 * batch * HQ * D * total
        self.bytes = 2.0 * batch * total * HKV * D * 2  # K and V of the cache, read once

    def step(self):
        self.cache.rewind(self.mark)
        with torch.no_grad():
            return attn.attention(self.q1, self.k1, self.v1, self.step_rows, self.cache)

    # SDPA on the same cache: our store viewed as [batch, past + 1, HKV, D]
    def _cache4d(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(self.b, self.past + 1, t.shape[1], D).transpose(1, 2)

    def sdpa_setup(self) -> None:
        self.kc, self.vc = self._cache4d(self.cache.k), self._cache4d(self.cache.v)
        self.q4 = self.q1.view(self.b, 1, HQ, D).transpose(1, 2)
        self.k_exp = self.kc.repeat_interleave(G, dim=1)
        self.v_exp = self.vc.repeat_interleave(G, dim=1)

    def sdpa_gqa(self):
        with torch.no_grad():
            return F.scaled_dot_product_attention(self.q4, self.kc, self.vc, enable_gqa=True)

    def sdpa_gqa_append(self):
        with torch.no_grad():  # what a server does per step: append the new token's K/V, then attend
            self.kc[:, :, self.past] = self.k1.view(self.b, HKV, D)
            self.vc[:, :, self.past] = self.v1.view(self.b, HKV, D)
            return F.scaled_dot_product_attention(self.q4, self.kc, self.vc, enable_gqa=True)

    def sdpa_gqa_flash(self):
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(self.q4, self.kc, self.vc, enable_gqa=True)

    def sdpa_flash_expanded(self):
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(self.q4, self.k_exp, self.v_exp)


# ------------------------------------------------------------------------------------------------ checks
def _cuts(seq: int, sample: int) -> list[int]:
    """Irregular chunk boundaries of one sample (on and off key-block and tile boundaries; differ per sample)."""
    a = (137 * sample + 301) % (seq // 3) + 1
    b = seq // 2 + (97 * sample) % (seq // 4)
    return sorted({0, a, 256 if a < 256 < b else b, b, seq})


def _run_calls(p: Prefill, calls: list[list[tuple[int, int, int]]], config: attn.AttnConfig, schedule: str,
               grad: bool = True) -> dict[str, torch.Tensor]:
    """Calls of (sample, start, stop) pieces; forward all then backward (reverse) or F0 B0 F1 B1 (interleaved)."""
    cache = p.cache(config)
    o_all = torch.zeros_like(p.q)
    dq_all = torch.zeros_like(p.q)
    pending = []
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


def _check_layouts(p: Prefill, config: attn.AttnConfig, decode_tail: int = 16) -> dict[str, bool]:
    full = _run_calls(p, [[(s, 0, p.s) for s in range(p.b)]], config, "reverse")
    cuts = [_cuts(p.s, s) for s in range(p.b)]
    n_calls = max(len(c) - 1 for c in cuts)
    chunked = [[(s, c[i], c[i + 1]) for s, c in enumerate(cuts) if i + 1 < len(c)] for i in range(n_calls)]
    prefix = [[(s, 0, p.s - decode_tail) for s in range(p.b)]]
    decode = prefix + [[(s, p.s - decode_tail + i, p.s - decode_tail + i + 1) for s in range(p.b)]
                       for i in range(decode_tail)]
    res = {}
    for name, calls, sched in (("chunked_reverse", chunked, "reverse"), ("chunked_interleaved", chunked, "interleaved"),
                               ("decode_reverse", decode, "reverse")):
        got = _run_calls(p, calls, config, sched)
        for t in ("o", "dq", "dk", "dv"):
            res[f"{name}.{t}"] = same_bits(got[t], full[t])
    infer = _run_calls(p, decode, config, "reverse", grad=False)
    res["decode_no_grad.o == training forward"] = same_bits(infer["o"], full["o"])
    return res


def _signed_zero(config: attn.AttnConfig) -> dict[str, object]:
    """Masked keys of a written slot add 0 * (-1) = -0; of an unwritten one 0 * (+0). One call vs two calls."""
    bn = config.bn
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
        cache = attn.AttentionCache([n], HQ, D, DEV, kv_heads=HKV, config=config)
        with torch.no_grad():
            return torch.cat([attn.attention(q[a:b], k[a:b], v[a:b], RowIdentity.packed([b - a], [0], [a]), cache)
                              for a, b in calls])

    one, two = run([(0, n)]), run([(0, r + 1), (r + 1, n)])
    neg = bool(torch.signbit(one[one == 0]).any() or torch.signbit(two[two == 0]).any())
    return {"same_bits": same_bits(one, two), "negative_zero_in_o": neg, "ok": same_bits(one, two) and not neg}


# ------------------------------------------------------------------------------------------------ timing
def _time_prefill(p: Prefill, rep: int) -> dict[str, object]:
    p.sdpa_setup()
    r: dict[str, object] = {"shape": f"{p.b} x {p.s}", "flops_fwd": p.flops_fwd}
    for name, fn in (("ours_fwd", p.fwd), ("ours_fwd_fresh_plan", p.fwd_fresh_plan), ("ours_fwd_bwd", p.fwd_bwd),
                     ("sdpa_flash_fwd", p.sdpa_fwd_flash), ("sdpa_gqa_fwd", p.sdpa_fwd_gqa),
                     ("sdpa_flash_expand_inside_fwd", p.sdpa_fwd_flash_expand_inside),
                     ("sdpa_flash_fwd_bwd", p.sdpa_fwd_bwd_flash), ("sdpa_gqa_fwd_bwd", p.sdpa_fwd_bwd_gqa),
                     ("sdpa_flash_expand_inside_fwd_bwd", p.sdpa_fwd_bwd_flash_expand_inside)):
        try:
            r[f"{name}_ms"] = _med(fn, rep)
        except Exception as exc:
            r[f"{name}_ms"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    for name, fn in (("ours_fwd", p.fwd), ("ours_fwd_bwd", p.fwd_bwd), ("sdpa_flash_fwd", p.sdpa_fwd_flash),
                     ("sdpa_flash_fwd_bwd", p.sdpa_fwd_bwd_flash)):
        r[f"{name}_graph_ms"] = _graph_ms(fn, rep)
    for ours, base in (("ours_fwd", "sdpa_flash_fwd"), ("ours_fwd_bwd", "sdpa_flash_fwd_bwd"),
                       ("ours_fwd_graph", "sdpa_flash_fwd_graph"), ("ours_fwd_bwd_graph", "sdpa_flash_fwd_bwd_graph")):
        a, b = r.get(f"{ours}_ms"), r.get(f"{base}_ms")
        if isinstance(a, float) and isinstance(b, float):
            r[f"ratio_{ours}"] = a / b
    if isinstance(r.get("ours_fwd_ms"), float):
        r["ours_fwd_tflops"] = p.flops_fwd / r["ours_fwd_ms"] / 1e9
    return r


def _time_decode(dc: Decode, rep: int) -> dict[str, object]:
    dc.sdpa_setup()
    r: dict[str, object] = {"shape": f"{dc.b} x 1 over {dc.past}", "bytes_kv": dc.bytes}
    for name, fn in (("ours", dc.step), ("sdpa_gqa", dc.sdpa_gqa), ("sdpa_gqa_append", dc.sdpa_gqa_append),
                     ("sdpa_gqa_flash", dc.sdpa_gqa_flash), ("sdpa_flash_expanded", dc.sdpa_flash_expanded)):
        try:
            r[f"{name}_ms"] = _med(fn, rep)
        except Exception as exc:
            r[f"{name}_ms"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    r["ours_graph_ms"] = _graph_ms(dc.step, rep)
    r["sdpa_gqa_graph_ms"] = _graph_ms(dc.sdpa_gqa, rep)
    same_cache = [r[k] for k in ("sdpa_gqa_ms", "sdpa_gqa_flash_ms", "sdpa_gqa_append_ms") if isinstance(r[k], float)]
    if isinstance(r["ours_ms"], float) and same_cache:
        r["ratio_vs_best_sdpa_same_cache"] = r["ours_ms"] / min(same_cache)
        r["ours_gbps"] = dc.bytes / r["ours_ms"] / 1e6
    if isinstance(r["ours_graph_ms"], float) and isinstance(r["sdpa_gqa_graph_ms"], float):
        r["ratio_graph"] = r["ours_graph_ms"] / r["sdpa_gqa_graph_ms"]
    return r


def _ceilings() -> dict[str, float]:
    """The run's own copy bandwidth and bf16 matmul rate (METHOD.md: measure the two ceilings once)."""
    x = torch.empty(2 ** 29, dtype=torch.bfloat16, device=DEV).normal_()
    y = torch.empty_like(x)
    copy_ms = _med(lambda: y.copy_(x), 50)
    a, b = _rand(8192, 8192, seed=90), _rand(8192, 8192, seed=91)
    mm_ms = _med(lambda: a @ b, 50)
    return {"copy_GBps": 2 * 2 ** 30 / copy_ms / 1e6, "bf16_matmul_TFLOPs": 2 * 8192 ** 3 / mm_ms / 1e9}


VARIANTS = {  # name -> config changes (each a pinned config of its own; bits differ between variants, not layouts)
    "no_split": {"split": False},
    "rowsum_dot": {"rowsum_dot": True, "fp32_grads": False},
    "bf16_grads": {"fp32_grads": False},  # FlashAttention precision for dK / dV: what FP32-class costs
    "fwd_bn128_w8_s2": {"bn": 128, "fwd_stages": 2},
    "fwd_bm64_w4": {"bm": 64, "fwd_warps": 4},
    "dq_bn32_s3": {"dq_bn": 32, "dq_stages": 3},
    "kv_tile16": {"tile": 16},
    "kv_tile64": {"tile": 64},
    "kv_stages3": {"kv_stages": 3},
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting config variants after this")
    ap.add_argument("--rep", type=int, default=100, help="do_bench repetition time in ms")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    prod = attn.GPU_CONFIG
    res: dict[str, object] = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "host": platform.node(), "config": dataclasses.asdict(prod), "heads": HQ, "kv_heads": HKV, "head_dim": D,
    }
    failed_prod, failed_variant = [], []
    table = []

    def save() -> None:
        (args.out_dir / "attention_h200.json").write_text(json.dumps(res, indent=1, default=str))

    try:
        res["ceilings"] = _ceilings()
        p8 = Prefill(8, 1024, prod)
        checks = _check_layouts(p8, prod)
        checks.update({f"signed_zero.{k}": v for k, v in _signed_zero(prod).items() if k == "ok"})
        res["checks_8x1024"] = checks
        p2 = Prefill(2, 8192, prod, seed=20)
        res["checks_2x8192"] = _check_layouts(p2, prod, decode_tail=4)
        failed_prod = [f"{shape}:{k}" for shape in ("checks_8x1024", "checks_2x8192")
                       for k, ok in res[shape].items() if not ok]
        save()
        for key, p in (("prefill_8x1024", p8), ("prefill_2x8192", p2)):
            res[key] = _time_prefill(p, args.rep)
            save()
        dc = Decode(64, 4096, prod)
        res["decode_64x4096"] = _time_decode(dc, args.rep)
        del dc
        save()
        res["variants"] = {}
        for name, change in VARIANTS.items():
            if time.time() - START > args.budget_s:
                res["variants"][name] = "skipped: time budget"
                continue
            cfg = dataclasses.replace(prod, **change)
            v: dict[str, object] = {"change": change}
            try:
                vc = _check_layouts(p8, cfg)
                v["checks_ok"] = all(vc.values())
                v["failed_checks"] = [k for k, ok in vc.items() if not ok]
                if not v["checks_ok"]:
                    failed_variant.append(name)
                pv = Prefill(8, 1024, cfg)
                v["fwd_ms"] = _med(pv.fwd, args.rep)
                v["fwd_bwd_ms"] = _med(pv.fwd_bwd, args.rep)
                v["fwd_graph_ms"] = _graph_ms(pv.fwd, args.rep)
                v["fwd_bwd_graph_ms"] = _graph_ms(pv.fwd_bwd, args.rep)
            except Exception as exc:
                v["error"] = f"{type(exc).__name__}: {exc}"[:400]
                failed_variant.append(name)
            res["variants"][name] = v
            save()
    except Exception:  # keep what was measured, then fail loudly
        res["error"] = traceback.format_exc()[-3000:]
        save()
        print(res["error"], file=sys.stderr)
        return 1
    res["failed_checks"] = failed_prod
    res["failed_variants"] = failed_variant
    res["wall_s"] = time.time() - START
    save()

    def f(x) -> str:
        return f"{x:.3f}" if isinstance(x, float) else str(x)[:40]

    for key in ("prefill_8x1024", "prefill_2x8192"):
        r = res[key]
        table.append(f"{key}: fwd ours {f(r.get('ours_fwd_ms'))} ms / sdpa flash {f(r.get('sdpa_flash_fwd_ms'))} "
                     f"(gqa {f(r.get('sdpa_gqa_fwd_ms'))}) = {f(r.get('ratio_ours_fwd'))}x; kernels "
                     f"{f(r.get('ours_fwd_graph_ms'))}/{f(r.get('sdpa_flash_fwd_graph_ms'))} = "
                     f"{f(r.get('ratio_ours_fwd_graph'))}x")
        table.append(f"{key}: fwd+bwd ours {f(r.get('ours_fwd_bwd_ms'))} ms / sdpa flash "
                     f"{f(r.get('sdpa_flash_fwd_bwd_ms'))} (gqa {f(r.get('sdpa_gqa_fwd_bwd_ms'))}) = "
                     f"{f(r.get('ratio_ours_fwd_bwd'))}x; kernels {f(r.get('ours_fwd_bwd_graph_ms'))}/"
                     f"{f(r.get('sdpa_flash_fwd_bwd_graph_ms'))} = {f(r.get('ratio_ours_fwd_bwd_graph'))}x")
    r = res["decode_64x4096"]
    table.append(f"decode 64x1/4096: ours {f(r.get('ours_ms'))} ms ({f(r.get('ours_gbps'))} GB/s) / sdpa gqa "
                 f"{f(r.get('sdpa_gqa_ms'))} (flash {f(r.get('sdpa_gqa_flash_ms'))}, append "
                 f"{f(r.get('sdpa_gqa_append_ms'))}, expanded {f(r.get('sdpa_flash_expanded_ms'))}) = "
                 f"{f(r.get('ratio_vs_best_sdpa_same_cache'))}x; kernels {f(r.get('ratio_graph'))}x")
    for name, v in res["variants"].items():
        if isinstance(v, dict):
            verdict = "PASS" if v.get("checks_ok") else "FAIL " + str(v.get("failed_checks") or v.get("error"))[:80]
            table.append(f"variant {name}: checks {verdict} fwd {f(v.get('fwd_ms'))} fwd+bwd {f(v.get('fwd_bwd_ms'))} "
                         f"(graph {f(v.get('fwd_graph_ms'))} / {f(v.get('fwd_bwd_graph_ms'))})")
    table.append(f"ceilings: {res['ceilings']}")
    table.append(f"checks (production): {'PASS' if not failed_prod else 'FAIL ' + ', '.join(failed_prod)}")
    print("\n".join(table), flush=True)
    if failed_prod:
        return 1
    return 3 if failed_variant else 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("bench_attention: needs a CUDA GPU", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main())
