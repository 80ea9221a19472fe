"""One training step (forward + backward) of the batch-invariant Qwen3-shaped chain vs the stock torch chain,
end to end, plus the bitwise checks that make the invariant chain worth its cost.

The same gradsweep.nn model code runs both: family "triton" (batch-invariant kernels, FP32 main grads folded in
canonical order, everything host-side included: fold plans, attention plans, uploads) and family "torch"
(stock PyTorch in bf16: F.linear, HF-style RMSNorm and RoPE, SDPA per sample, logits + FP32 log_softmax,
autograd bf16 .grad). Default shape: Qwen3-8B's layer (hidden 4096, 32 query / 8 KV heads x 128, intermediate
12288, vocab 151936), 2 layers, 16384 tokens in 8 irregular samples.

Bitwise checks (any failure: exit 1): the packed step rerun; the same tokens as one call per sample and as
irregular chunks (chunked prefill through the KV cache; layerwise backward), each giving the packed step's
logp and every main grad bit for bit; a decode tail (no gradients: each sample's prefix in one call, then its
last tokens one call at a time) giving the packed step's logp. The speed target (<= 1.3x stock) is reported,
not enforced.

Usage (CUDA box): PYTHONPATH=. python3 bench/bench_chain.py --out-dir bench/results/chain
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

from gradsweep.canonical import RowIdentity
from gradsweep.nn import Qwen3Decoder, Qwen3Shape, new_context
from gradsweep.nn.context import ChainContext
from gradsweep.nn.qwen3 import WEIGHTS

LENGTHS = [4096, 3000, 2048, 2048, 1500, 1500, 1100, 1092]  # 16384 tokens
TARGET_RATIO = 1.3


def _weights(shape: Qwen3Shape, device: str, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for w in WEIGHTS:
        u = (torch.rand(w.full_shape(shape), generator=gen, device=device, dtype=torch.float32) * 2 - 1) * math.sqrt(3)
        out[w.name] = (w.offset + w.scale(shape) * u).to(torch.bfloat16).requires_grad_(True)
    return out


def _index(rows: RowIdentity, starts: list[int], device: str) -> torch.Tensor:
    return (torch.as_tensor(starts)[rows.sample] + rows.position).to(device)


class Bench:
    def __init__(self, shape: Qwen3Shape, lengths: list[int], device: str, seed: int) -> None:
        self.shape, self.lengths, self.device = shape, lengths, device
        self.starts = [sum(lengths[:i]) for i in range(len(lengths))]
        total = sum(lengths)
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        self.ids = torch.randint(0, shape.vocab, (total,), generator=gen, device=device)
        self.targets = torch.randint(0, shape.vocab, (total,), generator=gen, device=device)
        self.upstream = torch.randn(total, generator=gen, device=device) / total
        self.weights = _weights(shape, device, seed)
        self.main_grads = {w.name: torch.zeros(w.full_shape(shape), dtype=torch.float32, device=device)
                           for w in WEIGHTS}
        self.invariant = Qwen3Decoder(shape, "triton", self.weights)
        self.stock = Qwen3Decoder(shape, "torch", self.weights)

    # -- one step -----------------------------------------------------------------------------------------------
    def invariant_step(self, calls: list[RowIdentity], timed: dict | None = None) -> torch.Tensor:
        """Forward every call, then the backwards in reverse call order; returns logp in logical order."""
        for g in self.main_grads.values():
            g.zero_()
        sync()
        t0 = time.perf_counter()
        ctx = new_context(self.shape, self.lengths, self.device, self.main_grads, family="triton")
        outs = []
        for rows in calls:
            ctx.begin_call(rows)
            idx = _index(rows, self.starts, self.device)
            outs.append((idx, self.invariant(self.ids[idx], self.targets[idx], ctx)))
        sync()
        t1 = time.perf_counter()
        for idx, out in reversed(outs):
            out.backward(self.upstream[idx])
        sync()
        t2 = time.perf_counter()
        if timed is not None:
            timed.setdefault("fwd", []).append((t1 - t0) * 1e3)
            timed.setdefault("bwd", []).append((t2 - t1) * 1e3)
            timed.setdefault("step", []).append((t2 - t0) * 1e3)
        for f in ctx.folds.values():
            f.finish()
        logp = torch.empty(sum(self.lengths), dtype=torch.float32, device=self.device)
        for idx, out in outs:
            logp[idx] = out.detach()
        return logp

    def stock_step(self, timed: dict) -> torch.Tensor:
        for w in self.weights.values():
            w.grad = None
        sync()
        t0 = time.perf_counter()
        ctx = new_context(self.shape, self.lengths, self.device, family="torch")
        ctx.begin_call(RowIdentity.packed(self.lengths))
        out = self.stock(self.ids, self.targets, ctx)
        sync()
        t1 = time.perf_counter()
        out.backward(self.upstream)
        sync()
        t2 = time.perf_counter()
        timed.setdefault("fwd", []).append((t1 - t0) * 1e3)
        timed.setdefault("bwd", []).append((t2 - t1) * 1e3)
        timed.setdefault("step", []).append((t2 - t0) * 1e3)
        return out.detach()

    def grads(self) -> dict[str, torch.Tensor]:
        return {n: g.clone() for n, g in self.main_grads.items()}

    # -- layouts ------------------------------------------------------------------------------------------------
    def packed(self) -> list[RowIdentity]:
        return [RowIdentity.packed(self.lengths)]

    def per_sample(self) -> list[RowIdentity]:
        return [RowIdentity.packed([n], [s]) for s, n in enumerate(self.lengths)]

    def chunked(self) -> list[RowIdentity]:
        """Irregular chunks (a third, then the rest in two uneven pieces), all samples' k-th chunks in call k."""
        cuts = [[n // 3, (n - n // 3) * 2 // 5, n - n // 3 - (n - n // 3) * 2 // 5] for n in self.lengths]
        calls = []
        for k in range(3):
            pieces = [(s, sum(c[:k]), c[k]) for s, c in enumerate(cuts) if c[k] > 0]
            calls.append(RowIdentity.packed([p[2] for p in pieces], [p[0] for p in pieces], [p[1] for p in pieces]))
        return calls

    def decode_tail(self, tail: int) -> torch.Tensor:
        """No gradients: each sample's prefix in one call, then its last ``tail`` tokens one call at a time."""
        ctx = ChainContext(self.lengths, self.device)
        logp = torch.empty(sum(self.lengths), dtype=torch.float32, device=self.device)
        prefix = RowIdentity.packed([n - tail for n in self.lengths])
        calls = [prefix] + [RowIdentity.packed([1] * len(self.lengths), list(range(len(self.lengths))),
                                               [n - tail + j for n in self.lengths]) for j in range(tail)]
        with torch.no_grad():
            for rows in calls:
                ctx.begin_call(rows)
                idx = _index(rows, self.starts, self.device)
                logp[idx] = self.invariant(self.ids[idx], self.targets[idx], ctx)
        return logp


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2]


def _bitwise(name: str, a: torch.Tensor, b: torch.Tensor) -> dict:
    same = a.shape == b.shape and bool((a.view(torch.int32) == b.view(torch.int32)).all())
    diff = 0 if same else int((a.view(torch.int32) != b.view(torch.int32)).sum())
    return {"check": name, "pass": same, "mismatched": diff}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", required=True, help="directory for chain_bench.json")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps (after 2 warm-up steps)")
    ap.add_argument("--lengths", type=str, default=",".join(map(str, LENGTHS)))
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=12288)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = Qwen3Shape(hidden=args.hidden, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                       intermediate=args.intermediate, vocab=args.vocab, layers=args.layers, eps=1e-6,
                       rope_theta=1.0e6)
    lengths = [int(x) for x in args.lengths.split(",")]
    bench = Bench(shape, lengths, args.device, args.seed)
    result: dict = {"shape": shape.model_dump(), "lengths": lengths, "tokens": sum(lengths),
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                    "torch": torch.__version__, "target_ratio": TARGET_RATIO}
    try:
        import triton
        result["triton"] = triton.__version__
    except ImportError:
        result["triton"] = None

    timed_inv: dict = {}
    timed_stock: dict = {}
    for _ in range(2):  # warm-up: Triton compiles and tunes, caches allocate
        bench.invariant_step(bench.packed())
        bench.stock_step({})
    for _ in range(args.steps):  # interleaved, so drift of clocks hits both alike
        bench.invariant_step(bench.packed(), timed_inv)
        bench.stock_step(timed_stock)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        bench.invariant_step(bench.packed())
        result["invariant_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
        bench.stock_step({})
        result["stock_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    for name, timed in (("invariant", timed_inv), ("stock", timed_stock)):
        result[name] = {k: _median(v) for k, v in timed.items()} | {"steps_ms": timed["step"]}
    ratio = result["invariant"]["step"] / result["stock"]["step"]
    result["ratio_step"] = ratio
    result["ratio_fwd"] = result["invariant"]["fwd"] / result["stock"]["fwd"]
    result["ratio_bwd"] = result["invariant"]["bwd"] / result["stock"]["bwd"]
    result["target_met"] = ratio <= TARGET_RATIO
    print(f"chain step (fwd+bwd), {sum(lengths)} tokens, {shape.layers} layers, hidden {shape.hidden}, "
          f"{shape.heads}/{shape.kv_heads} heads, vocab {shape.vocab}: invariant {result['invariant']['step']:.1f} ms "
          f"(fwd {result['invariant']['fwd']:.1f}, bwd {result['invariant']['bwd']:.1f}), stock "
          f"{result['stock']['step']:.1f} ms (fwd {result['stock']['fwd']:.1f}, bwd {result['stock']['bwd']:.1f}): "
          f"{ratio:.2f}x [target <= {TARGET_RATIO}: {'met' if ratio <= TARGET_RATIO else 'MISSED'}]", flush=True)

    checks = []
    logp_a = bench.invariant_step(bench.packed())
    grads_a = bench.grads()
    logp_b = bench.invariant_step(bench.packed())
    checks.append(_bitwise("rerun logp", logp_a, logp_b))
    checks += [_bitwise(f"rerun d{n}", grads_a[n], bench.main_grads[n]) for n in grads_a]
    for layout, calls in (("per_sample", bench.per_sample()), ("chunked", bench.chunked())):
        logp = bench.invariant_step(calls)
        checks.append(_bitwise(f"{layout} logp", logp_a, logp))
        checks += [_bitwise(f"{layout} d{n}", grads_a[n], bench.main_grads[n]) for n in grads_a]
    checks.append(_bitwise("decode tail logp", logp_a, bench.decode_tail(4)))
    result["checks"] = checks
    failed = [c for c in checks if not c["pass"]]
    for c in checks:
        tail = "" if c["pass"] else f" ({c['mismatched']} differ)"
        print(f"  {'PASS' if c['pass'] else 'FAIL'} {c['check']}{tail}")
    stock_logp = bench.stock_step({})
    result["stock_vs_invariant_logp_max_abs"] = float((stock_logp - logp_a).abs().max())
    result["pass"] = not failed
    (out_dir / "chain_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{len(checks) - len(failed)}/{len(checks)} bitwise checks passed; wrote {out_dir / 'chain_bench.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
