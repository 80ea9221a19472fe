"""Speed and correctness of the Triton GEMM / lm_head / logp / linear_logp kernels (issues 5 and 13), in one run.

    PYTHONPATH=. python bench/bench_kernels_ii.py --out-dir OUT            # CUDA box: writes OUT/kernels_ii.json
    TRITON_INTERPRET=1 PYTHONPATH=. python bench/bench_kernels_ii.py --dry-run --out-dir OUT   # CPU: plumbing

Speed, with the copy-bandwidth and cuBLAS ceilings of the same run: forward GEMM and dX against cuBLAS (small M
split into host and device time), the canonical dW fold ``kernels`` (a prepared fold step) next to ``e2e`` (a
fresh CanonicalFold, take_tiles, uploads, launches, kernels: what a training step pays), packed and chunked,
selected-token logp, fused linear_logp.
Correctness, never with a private tolerance: every op through ``check_kernel`` (the sweep's own judge, the
contract's bounds) at the default manifest's shapes on this device; at full size, bitwise: M-independence of
rows, dW across call splits, dW from staged storage, e2e vs kernels-only. Any failed check or exception exits
non-zero (the JSON written so far is kept).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import triton

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.triton_kernels import gemm
from gradsweep.triton_kernels import linear_logp as ll
from gradsweep.triton_kernels import logp as lp
from gradsweep.triton_kernels._common import same_bits
from gradsweep.triton_kernels.gemm import TILE, det_linear, dw_fold, dw_fold_tiles, matmul_invariant

OPS = ("det_gemm", "lm_head", "logp", "linear_logp")


class Run:
    """Results of the run, saved after every row (a crash keeps what was measured)."""

    def __init__(self, path: Path, dry: bool, device: torch.device) -> None:
        self.path, self.dry, self.device = path, dry, device
        self.res: dict = {"meta": {}, "ceilings": {}, "perf": [], "checks": []}

    def save(self) -> None:
        self.path.write_text(json.dumps(self.res, indent=1))

    def bench(self, fn: Callable[[], object]) -> float:
        """Median ms; one call first so that tuning stays outside the timing."""
        fn()
        if self.dry:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median"))

    def perf(self, name: str, ours: float, ref: float, ref_name: str, target: float | None, **extra) -> None:
        row = {"name": name, "ours_ms": ours, "ref_ms": ref, "ref": ref_name, "ratio": ours / ref,
               "target": target, "meets": None if target is None else ours / ref <= target, **extra}
        self.res["perf"].append(row)
        tgt = "" if target is None else f"target <= {target:.2f}x {'PASS' if row['meets'] else 'MISS'}"
        print(f"{name:<52} ours {ours:9.4f} ms  {ref_name} {ref:9.4f} ms  ratio {ours / ref:5.2f}  {tgt} "
              + " ".join(f"{k}={v}" for k, v in extra.items()), flush=True)
        self.save()

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.res["checks"].append({"name": name, "pass": bool(ok), "detail": detail})
        print(f"CHECK {name:<60} {'PASS' if ok else 'FAIL'} {detail}", flush=True)
        self.save()

    def rnd(self, *shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, device=self.device) * scale).to(torch.bfloat16)


def sample_lengths(total: int, seed: int, lo: int, hi: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    out, left = [], total
    while left > 0:
        n = min(left, int(torch.randint(lo, hi, (1,), generator=g)))
        out.append(n)
        left -= n
    return out


def split(t: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, RowIdentity, RowIdentity]:
    """Rows of a packed step -> the chunked calls' rows (first 3/7 of every sample, then the rest)."""
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)
    cut = [min(n, (3 * n) // 7 + 1) for n in lengths]
    a = torch.cat([t[o:o + c] for o, c in zip(offs, cut)]).contiguous()
    b = torch.cat([t[o + c:o + n] for o, c, n in zip(offs, cut, lengths)]).contiguous()
    return a, b, RowIdentity.packed(cut), RowIdentity.packed([n - c for n, c in zip(lengths, cut)], starts=cut)


# ----------------------------------------------------------------------------------------------- sections
def correctness(run: Run) -> None:
    """Every op through check_kernel on this device: every layout of the default manifest, the contract's bounds."""
    for op in OPS:
        report = check_kernel(op, f"triton.{op}", device=run.device)
        run.check(f"{op}: every layout green (default shapes, {run.device.type})", report.ok,
                  report.first_failure or "")


def ceilings(run: Run, big: int, mm: int) -> None:
    x = torch.empty(big, dtype=torch.bfloat16, device=run.device).normal_()
    y = torch.empty_like(x)
    run.res["ceilings"]["copy_GBps"] = 2 * x.numel() * 2 / run.bench(lambda: y.copy_(x)) / 1e6
    a, b = run.rnd(mm, mm), run.rnd(mm, mm)
    run.res["ceilings"]["cublas_bf16_TFLOPs"] = 2 * mm ** 3 / run.bench(lambda: a @ b) / 1e9
    print("ceilings", run.res["ceilings"], flush=True)


def invariance(run: Run, k: int, vocab: int, rows: int) -> None:
    """Bitwise, at full size: rows independent of M and of their neighbours; dW across call splits."""
    for n in (k, vocab):
        w = run.rnd(n, k, scale=0.02)
        x = run.rnd(rows, k)
        full = matmul_invariant(x, w)
        for m in (1, 16, 256):
            run.check(f"fwd M-independence N={n} M={m}", same_bits(matmul_invariant(x[:m], w), full[:m]))
        for i in (5, rows // 4, rows - 1):
            run.check(f"fwd row {i} alone N={n}", same_bits(matmul_invariant(x[i:i + 1], w), full[i:i + 1]))
    w = run.rnd(k, k, scale=0.02)
    dy = run.rnd(rows, k)
    dfull = matmul_invariant(dy, w.t())
    for m in (1, 16, 256):
        run.check(f"dX M-independence M={m}", same_bits(matmul_invariant(dy[:m], w.t()), dfull[:m]))
    # unaligned dX (N = 509: no contiguity hint, strided operands)
    w2, dy2 = run.rnd(600, 520, scale=0.02), run.rnd(rows, 600)
    d_full = matmul_invariant(dy2[:, :500], w2[:500, :509].t())
    for m in (1, 7, 256):
        run.check(f"dX unaligned M-independence M={m}",
                  same_bits(matmul_invariant(dy2[:m, :500], w2[:500, :509].t()), d_full[:m]))
    # dW through det_linear's autograd: one call vs chunks split inside tiles vs one call per sample
    lengths = sample_lengths(rows, 1, rows // 8, rows // 3)
    ident = RowIdentity.packed(lengths)
    x, wp, dy = run.rnd(rows, k), run.rnd(k, k, scale=0.02).requires_grad_(), run.rnd(rows, k)

    def dw(bounds: list[tuple[int, int]]) -> torch.Tensor:
        mg = torch.zeros(k, k, dtype=torch.float32, device=run.device)
        fold = CanonicalFold(mg, lengths, TILE)
        for lo, hi in bounds:
            y = det_linear(x[lo:hi], wp, RowIdentity(ident.sample[lo:hi], ident.position[lo:hi]), fold)
            y.backward(dy[lo:hi])
        fold.finish()
        return mg
    a = dw([(0, rows)])
    odd = rows // 2 + 37
    run.check("dW B=N vs 2 chunked calls (cut inside a tile)", same_bits(a, dw([(0, odd), (odd, rows)])))
    run.check("dW B=N vs 2 chunked calls in reverse order", same_bits(a, dw([(odd, rows), (0, odd)])))
    offs = [0]
    for n in lengths:
        offs.append(offs[-1] + n)
    run.check("dW B=N vs N x B=1", same_bits(a, dw(list(itertools.pairwise(offs)))))


def launch_split(run: Run) -> None:
    """Small-M forward and dX: host time (fast launch on / off) vs device time (graph replay), vs cuBLAS."""
    def gpu_time(fns) -> float:
        for f in fns:
            f()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(24):
                fns[i % len(fns)]()
        g.replay()
        torch.cuda.synchronize()
        return float(triton.testing.do_bench(g.replay, warmup=10, rep=60, return_mode="median")) / 24

    def host_time(fn, n: int = 300) -> float:
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) * 1e3 / n

    k = n = 4096
    ws = [run.rnd(n, k, scale=0.02) for _ in range(4)]
    for m in (1, 16, 256):
        x = run.rnd(m, k)
        fwd = ([lambda w=w, x=x: matmul_invariant(x, w) for w in ws], [lambda w=w, x=x: x @ w.T for w in ws])
        dx = ([lambda w=w, x=x: matmul_invariant(x, w.t()) for w in ws], [lambda w=w, x=x: x @ w for w in ws])
        for what, (ours, ref) in (("fwd", fwd), ("dX", dx)):
            row = {"name": f"{what} M={m} N=K=4096 launch split"}
            for fast in (True, False):
                gemm.FAST_LAUNCH = fast
                row[f"host_ms_fast{int(fast)}"] = host_time(ours[0])
                row[f"do_bench_ms_fast{int(fast)}"] = run.bench(ours[0])
            gemm.FAST_LAUNCH = True
            row["gpu_ms"] = gpu_time(ours)
            row["cublas_host_ms"] = host_time(ref[0])
            row["cublas_gpu_ms"] = gpu_time(ref)
            row["gpu_ratio"] = row["gpu_ms"] / row["cublas_gpu_ms"]
            run.res["perf"].append(row)
            print("  ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{v}" for k, v in row.items()), flush=True)
            run.save()


def forward_dx(run: Run, k: int, shapes: tuple[tuple[int, tuple[int, ...]], ...]) -> None:
    for n, ms in shapes:
        w = run.rnd(n, k, scale=0.02)
        for m in ms:
            x = run.rnd(m, k)
            t_o = run.bench(lambda x=x, w=w: matmul_invariant(x, w))
            t_c = run.bench(lambda x=x, w=w: x @ w.T)
            run.perf(f"fwd M={m} N={n} K={k}", t_o, t_c, "cuBLAS", 1.10 if m >= 256 else 1.25,
                     TFLOPs=round(2 * m * n * k / t_o / 1e9, 1))
    w = run.rnd(k, k, scale=0.02)
    for m in shapes[0][1]:
        dy = run.rnd(m, k)
        t_o = run.bench(lambda dy=dy: matmul_invariant(dy, w.t()))
        t_c = run.bench(lambda dy=dy: dy @ w)
        run.perf(f"dX M={m} N={k} K={k}", t_o, t_c, "cuBLAS", 1.10 if m >= 256 else 1.25)


def dw_gemm(run: Run, k: int, sizes: tuple[int, ...]) -> None:
    """The canonical dW fold: kernels-only vs end to end (packed and chunked) vs cuBLAS X^T dY; bits of each."""
    for t in sizes:
        dw_gemm_at(run, k, t)


def dw_gemm_at(run: Run, k: int, t: int) -> None:
    n = k
    x, dy = run.rnd(t, k), run.rnd(t, n)
    lengths = sample_lengths(t, t, max(2, t // 40), max(3, t // 5))  # odd lengths: partial tiles
    rows = RowIdentity.packed(lengths)
    mg = torch.zeros(n, k, dtype=torch.float32, device=run.device)
    step = CanonicalFold(mg, lengths, TILE).take_tiles(rows, (x, dy))
    xa, xb, rows_a, rows_b = split(x, lengths)
    da, db, _, _ = split(dy, lengths)

    def e2e() -> None:
        dw_fold(CanonicalFold(mg, lengths, TILE).take_tiles(rows, (x, dy)), x, dy, mg)

    def e2e_chunked() -> None:
        fold = CanonicalFold(mg, lengths, TILE)
        dw_fold(fold.take_tiles(rows_a, (xa, da)), xa, da, mg)
        dw_fold(fold.take_tiles(rows_b, (xb, db)), xb, db, mg)
    t_k = run.bench(lambda: dw_fold_tiles(step.desc, x, dy, mg))
    t_c = run.bench(lambda: dy.t() @ x)
    note = {"samples": len(lengths), "tiles": step.num_tiles}
    run.perf(f"dW fold T={t} N=K={k} kernels (fp32 main grad)", t_k, t_c, "cuBLAS X^T dY",
             1.10 if t >= 16384 else 1.25, **note)
    t_e = run.bench(e2e)
    run.perf(f"dW fold T={t} N=K={k} e2e (fold + plan + upload)", t_e, t_c, "cuBLAS X^T dY", None, **note,
             e2e_over_kernels=round(t_e / t_k, 4), e2e_target="<= 1.03x kernels")
    t_ec = run.bench(e2e_chunked)
    run.perf(f"dW fold T={t} N=K={k} e2e chunked (2 calls)", t_ec, t_c, "cuBLAS X^T dY", None, **note,
             e2e_over_kernels=round(t_ec / t_k, 4))
    # bits: kernels-only = e2e = chunked e2e = the same tiles read from staged storage in another order
    ref = dw_fold_tiles(step.desc, x, dy, torch.zeros_like(mg))
    got = torch.zeros_like(mg)
    dw_fold(CanonicalFold(got, lengths, TILE).take_tiles(rows, (x, dy)), x, dy, got)
    run.check(f"dW T={t}: e2e and kernels-only same bits", same_bits(ref, got))
    got = torch.zeros_like(mg)
    fold = CanonicalFold(got, lengths, TILE)
    dw_fold(fold.take_tiles(rows_a, (xa, da)), xa, da, got)
    dw_fold(fold.take_tiles(rows_b, (xb, db)), xb, db, got)
    run.check(f"dW T={t}: chunked calls (tiles split across them) same bits", same_bits(ref, got))
    d = step.host_desc
    perm = torch.randperm(step.num_tiles)
    xs = torch.empty(step.num_tiles * TILE, k, dtype=x.dtype, device=x.device)
    dys = torch.empty(step.num_tiles * TILE, n, dtype=dy.dtype, device=dy.device)
    staged = torch.tensor(d).clone()
    for block, tile_idx in enumerate(perm.tolist()):
        r0, cnt = int(d[tile_idx, 0]), int(d[tile_idx, 1])
        xs[block * TILE:block * TILE + cnt] = x[r0:r0 + cnt]
        dys[block * TILE:block * TILE + cnt] = dy[r0:r0 + cnt]
        staged[tile_idx, 0] = -block * TILE - 1
    got = dw_fold_tiles(staged.to(run.device), x, dy, torch.zeros_like(mg), xs, dys)
    run.check(f"dW T={t}: tiles read from staged storage in another order same bits", same_bits(ref, got))


def logp_bench(run: Run, r: int, v: int) -> None:
    logits = run.rnd(r, v, scale=2.0)
    tg = torch.randint(0, v, (r,), device=run.device)
    if "copy_GBps" not in run.res["ceilings"]:
        ceilings(run, 1 << (19 if run.dry else 29), 64 if run.dry else 8192)
    copy = run.res["ceilings"]["copy_GBps"]
    t_o = run.bench(lambda: lp.logp_forward(logits, tg))
    gbps = r * v * 2 / t_o / 1e6
    run.res["perf"].append({"name": f"selected_logp fwd R={r} V={v}", "ours_ms": t_o, "GBps": gbps,
                            "frac_of_copy_bw": gbps / copy, "target": ">= 0.75", "meets": gbps / copy >= 0.75})
    print(f"selected_logp fwd: {t_o:.4f} ms  {gbps:.0f} GB/s = {gbps / copy:.2f} of copy bw (target >= 0.75)",
          flush=True)
    out, lse = lp.logp_forward(logits, tg)
    g = torch.randn(r, device=run.device)
    t_b = run.bench(lambda: lp.logp_backward(logits, tg, lse, g))
    gb = r * v * 4 / t_b / 1e6
    run.res["perf"].append({"name": f"selected_logp bwd R={r} V={v}", "ours_ms": t_b, "GBps": gb,
                            "frac_of_copy_bw": gb / copy})
    print(f"selected_logp bwd: {t_b:.4f} ms  {gb:.0f} GB/s = {gb / copy:.2f}", flush=True)
    for m in (1, 16, 256):
        run.check(f"logp M-independence M={m}", same_bits(lp.logp_forward(logits[:m], tg[:m])[0], out[:m]))
    run.save()


def linear_logp_bench(run: Run, r: int, v: int, k: int) -> None:
    h, w = run.rnd(r, k), run.rnd(v, k, scale=0.02)
    tg = torch.randint(0, v, (r,), device=run.device)
    t_c = run.bench(lambda: h @ w.T)
    run.perf(f"lm_head GEMM (ours) R={r} V={v}", run.bench(lambda: matmul_invariant(h, w)), t_c, "cuBLAS", 1.10)
    run.perf(f"linear_logp fwd R={r} V={v}", run.bench(lambda: ll.fused_forward(h, w, tg)), t_c, "cuBLAS lm_head",
             1.15)
    lengths = sample_lengths(r, 7, r // 5, r // 2)
    rows = RowIdentity.packed(lengths)
    mg = torch.zeros(v, k, dtype=torch.float32, device=run.device)
    hh, wp = h.clone().requires_grad_(), w.clone().requires_grad_()

    def fwd_bwd() -> None:
        ll.linear_logp(hh, wp, tg, rows, CanonicalFold(mg, lengths, TILE)).sum().backward()
        hh.grad = None
    fwd_bwd()
    peak = None
    if not run.dry:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fwd_bwd()
        torch.cuda.synchronize()
        peak = round((torch.cuda.max_memory_allocated() - base) / 1e9, 3)
    run.perf(f"linear_logp fwd+bwd e2e R={r} V={v}", run.bench(fwd_bwd), t_c, "cuBLAS lm_head", 3.3,
             peak_extra_GB=peak, full_logits_GB=round(r * v * 2 / 1e9, 3))
    out = ll.fused_forward(h, w, tg)[0]
    for m in (1, 16, 256):
        run.check(f"linear_logp fwd M-independence M={m}", same_bits(ll.fused_forward(h[:m], w, tg[:m])[0], out[:m]))

    def dw(bounds: list[tuple[int, int]]) -> torch.Tensor:
        acc = torch.zeros(v, k, dtype=torch.float32, device=run.device)
        fold = CanonicalFold(acc, lengths, TILE)
        for lo, hi in bounds:
            ll.linear_logp(h[lo:hi], wp, tg[lo:hi], RowIdentity(rows.sample[lo:hi], rows.position[lo:hi]),
                           fold).sum().backward()
        fold.finish()
        return acc
    odd = r // 2 + 37
    a = dw([(0, r)])
    run.check("linear_logp dW B=N vs 2 chunked calls (cut inside a tile)", same_bits(a, dw([(0, odd), (odd, r)])))
    run.check("linear_logp dW B=N vs 2 chunked calls in reverse order", same_bits(a, dw([(odd, r), (0, odd)])))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True, help="directory for kernels_ii.json")
    ap.add_argument("--only", default="", help="comma-separated sections")
    ap.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes")
    args = ap.parse_args()
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        print(f"bench_kernels_ii: error: --out-dir {out} is not a directory", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("bench_kernels_ii: error: --dry-run needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("bench_kernels_ii: error: no CUDA device (use --dry-run under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    run = Run(out / "kernels_ii.json", args.dry_run, device)
    torch.manual_seed(0)
    run.res["meta"] = {"gpu": torch.cuda.get_device_name() if device.type == "cuda" else "cpu-interpreter",
                       "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda}
    print(run.res["meta"], flush=True)
    dry = args.dry_run
    sections: dict[str, Callable[[], None]] = {
        "correctness": lambda: correctness(run),
        "ceilings": lambda: ceilings(run, 1 << (19 if dry else 29), 64 if dry else 8192),
        "invariance": lambda: invariance(run, 64 if dry else 4096, 300 if dry else 151936, 300 if dry else 4096),
        "launch_split": lambda: None if dry else launch_split(run),
        "forward_dx": lambda: forward_dx(run, 64 if dry else 4096, ((64, (1, 16, 256)),) if dry else
                                         ((4096, (1, 16, 256, 4096)), (14336, (16, 4096)), (151936, (16, 4096)))),
        "dw_gemm": lambda: dw_gemm(run, 64 if dry else 4096, (300,) if dry else (4096, 16384)),
        "logp": lambda: logp_bench(run, 64 if dry else 4096, 300 if dry else 151936),
        "linear_logp": lambda: linear_logp_bench(run, 160 if dry else 4096, 300 if dry else 151936,
                                                 64 if dry else 4096),
    }
    chosen = [s for s in args.only.split(",") if s] or list(sections)
    unknown = sorted(set(chosen) - set(sections))
    if unknown:
        print(f"bench_kernels_ii: error: unknown --only section(s) {unknown}; known: {', '.join(sections)}",
              file=sys.stderr)
        return 2
    t0 = time.time()
    try:
        for name in chosen:
            ts = time.time()
            sections[name]()
            print(f"-- {name} took {time.time() - ts:.1f} s", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        run.res["meta"]["wall_s"] = time.time() - t0
        run.res["meta"]["tuned"] = {name: {str(k): [str(c), t.timings.get(k)] for k, c in t.best.items()}
                                    for name, t in (("mm", gemm._MM), ("dw", gemm._DW), ("dlogits", ll._DLOGITS))}
        run.save()
    failed = [c["name"] for c in run.res["checks"] if not c["pass"]]
    print("FAILED CHECKS: " + "; ".join(failed) if failed else f"all {len(run.res['checks'])} checks passed")
    print(f"wrote {run.path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
