"""Speed and correctness of the first half of the Triton kernels, end to end (issue 13), in one run.

    PYTHONPATH=. python bench/bench_kernels_i.py --out-dir OUT            # CUDA box: writes OUT/kernels_i.json
    TRITON_INTERPRET=1 PYTHONPATH=. python bench/bench_kernels_i.py --dry-run --out-dir OUT   # CPU: plumbing

Speed (median of triton.testing.do_bench, which flushes L2 between runs; every tensor >= 128 MiB):
- per op, stock torch vs ours, with the copy ceiling of the same run (ms, GB/s, % of copy, ratio);
- backward of the folding ops (rms_norm, qk_norm, embedding) in two variants: ``kernels`` (launches on a
  prepared fold step) and ``e2e`` (what a training step pays: a fresh CanonicalFold, take_tiles, uploads,
  launches, kernels), for one packed call and for a step cut into two chunked calls (tiles split across calls);
- host planning per call (take_tiles, incl. the staging copies it launches) at R rows, packed and chunked.
Correctness, never with a private tolerance: every op through ``check_kernel`` (the sweep's own judge, the
contract's bounds) at the default manifest's shapes on this device, and bitwise invariance at the bench shape
through ``check_kernel`` too; e2e and kernels-only main grads bitwise equal. Any failed check or exception
exits non-zero (the JSON written so far is kept).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.harness.kernel_check import check_kernel
from gradsweep.triton_kernels import _common
from gradsweep.triton_kernels import embedding as emb_mod
from gradsweep.triton_kernels import pack as pack_mod
from gradsweep.triton_kernels import qk_norm as qk_mod
from gradsweep.triton_kernels import rms_norm as rms_mod
from gradsweep.triton_kernels import rope as rope_mod
from gradsweep.triton_kernels import silu as silu_mod
from gradsweep.triton_kernels import swiglu as swiglu_mod
from gradsweep.triton_kernels._common import same_bits

EPS, THETA = 1e-6, 500000.0
BF16 = torch.bfloat16
OPS = ("rms_norm", "qk_norm", "rope", "silu", "swiglu", "embedding", "pack")


class Run:
    """Results of the run, saved after every row (a crash keeps what was measured)."""

    def __init__(self, path: Path, dry: bool) -> None:
        self.path, self.dry = path, dry
        self.res: dict = {"rows": [], "host_planning": [], "checks": []}

    def save(self) -> None:
        self.path.write_text(json.dumps(self.res, indent=1, default=lambda o: None if isinstance(o, float)
                                        and math.isnan(o) else str(o)))

    def time(self, fn: Callable[[], object]) -> float:
        """Median ms (do_bench on a GPU; one warm call then one timed call under the interpreter)."""
        if not self.dry:
            return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.res["checks"].append({"name": name, "pass": bool(ok), "detail": detail})
        print(f"CHECK {name:<60} {'PASS' if ok else 'FAIL'} {detail}", flush=True)
        self.save()


def irregular_lengths(total: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(total - 1, generator=g)[: n - 1].add(1).tolist())
    return [b - a for a, b in itertools.pairwise([0, *cuts, total])]


def chunked(lengths: list[int]) -> tuple[list[int], RowIdentity, RowIdentity]:
    """Each sample cut at 3/7 of its length (off tile boundaries): two calls, the step's first and second halves."""
    cut = [min(m, (3 * m) // 7 + 1) for m in lengths]
    first = RowIdentity.packed(cut)
    second = RowIdentity.packed([m - c for m, c in zip(lengths, cut)], starts=cut)
    return cut, first, second


def split_rows(t: torch.Tensor, lengths: list[int], cut: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of a packed step -> (first halves, second halves) in the chunked calls' order."""
    offs = [0, *itertools.accumulate(lengths)]
    a = torch.cat([t[o:o + c] for o, c in zip(offs, cut)])
    b = torch.cat([t[o + c:o + m] for o, c, m in zip(offs, cut, lengths)])
    return a.contiguous(), b.contiguous()


# ------------------------------------------------------------------------------------------------ speed
def speed(run: Run, args: argparse.Namespace, device: torch.device) -> None:
    R, H, NH = args.rows, args.hidden, args.heads
    D = H // NH
    big = (1 << 30) if not run.dry else (1 << 20)
    src = torch.empty(big // 2, dtype=BF16, device=device).normal_()
    dst = torch.empty_like(src)
    ceiling = 2 * big / run.time(lambda: dst.copy_(src)) / 1e6
    run.res["copy_ceiling_gbs"] = ceiling
    print(f"copy ceiling {ceiling:.1f} GB/s", flush=True)
    g = torch.Generator(device=device).manual_seed(0)

    def rn(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g, device=device).to(BF16)

    def row(op: str, direction: str, nbytes: int, torch_ms: float, variant: str, ms: float, note: str = "") -> None:
        gbs = nbytes / ms / 1e6
        r = {"op": op, "dir": direction, "variant": variant, "ms": ms, "gbs": gbs, "pct_copy": 100 * gbs / ceiling,
             "torch_ms": torch_ms, "ratio_vs_torch": ms / torch_ms, "note": note}
        run.res["rows"].append(r)
        print(f"{op:10s} {direction:4s} {variant:20s} {ms:8.4f} ms {r['pct_copy']:6.1f}% of copy | torch "
              f"{torch_ms:8.4f} ms | ours/torch {r['ratio_vs_torch']:5.2f} {note}", flush=True)
        run.save()

    n = R * H * 2  # bytes of one [R, H] bf16 tensor
    lengths = irregular_lengths(R, 13, seed=5)
    rows = RowIdentity.packed(lengths)
    cut, rows_a, rows_b = chunked(lengths)

    # ---- rms_norm and qk_norm: forward, backward kernels-only and end to end
    x, dy, dx = rn(R, H), rn(R, H), torch.empty(R, H, device=device, dtype=BF16)
    w = (1 + 0.1 * rn(H).float()).to(BF16)

    def bench_norm(op: str, mod, shape: tuple[int, ...], wv: torch.Tensor, cols: int) -> None:
        xv, dyv, dxv = x.view(shape), dy.view(shape), dx.view(shape)
        fwd = rms_mod.rms_norm_forward if op == "rms_norm" else qk_mod.qk_norm_forward
        backward = rms_mod.rms_norm_backward if op == "rms_norm" else qk_mod.qk_norm_backward
        row(op, "fwd", 2 * n, run.time(lambda: F.rms_norm(xv, (shape[-1],), wv, EPS)), "ours",
            run.time(lambda: fwd(xv, wv, EPS)))
        xr, wr = xv.clone().requires_grad_(True), wv.clone().requires_grad_(True)
        yt = F.rms_norm(xr, (shape[-1],), wr, EPS)
        t_torch = run.time(lambda: torch.autograd.grad(yt, (xr, wr), dyv, retain_graph=True))
        mg = torch.zeros(cols, device=device)
        step = CanonicalFold(mg, lengths, mod.TILE).take_tiles(rows, (xv, dyv))
        parts = torch.empty(step.num_tiles, cols, device=device)

        def kernels(acc: torch.Tensor = mg) -> None:
            mod._launch_bwd(step.desc, xv, dyv, xv, dyv, wv, dxv, parts, EPS, True, True)
            _common.fold_partials(parts, acc)

        def e2e() -> None:
            backward(xv, wv, dyv, EPS, rows, CanonicalFold(mg, lengths, mod.TILE))
        xa, xb = split_rows(xv, lengths, cut)
        da, db = split_rows(dyv, lengths, cut)

        def e2e_chunked() -> None:
            fold = CanonicalFold(mg, lengths, mod.TILE)
            backward(xa, wv, da, EPS, rows_a, fold)
            backward(xb, wv, db, EPS, rows_b, fold)
        note = f"{step.num_tiles} tiles of {mod.TILE}"
        row(op, "bwd", 3 * n, t_torch, "ours_kernels", run.time(kernels), note)
        row(op, "bwd", 3 * n, t_torch, "ours_e2e", run.time(e2e), note + "; fold + plan + uploads + launches")
        row(op, "bwd", 3 * n, t_torch, "ours_e2e_chunked", run.time(e2e_chunked), "2 calls, tiles split across them")
        a, b = torch.zeros_like(mg), torch.zeros_like(mg)
        dxa = backward(xv, wv, dyv, EPS, rows, CanonicalFold(a, lengths, mod.TILE))
        kernels(b)
        run.check(f"{op} bwd e2e and kernels-only: same dx and main grad bits", same_bits(a, b) and same_bits(dxa, dxv))

    bench_norm("rms_norm", rms_mod, (R, H), w, H)
    bench_norm("qk_norm", qk_mod, (R, NH, D), w[:D].contiguous(), D)

    # ---- rope, silu, swiglu (elementwise, no fold)
    xq, dq = x.view(R, NH, D), dy.view(R, NH, D)
    pos = torch.cat([torch.arange(m) for m in lengths]).to(device)
    inv = THETA ** (-torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    ang = pos.float()[:, None] * inv[None, :]
    cos = torch.cat([ang, ang], -1).cos().to(BF16)[:, None, :]
    sin = torch.cat([ang, ang], -1).sin().to(BF16)[:, None, :]

    def torch_rope(v: torch.Tensor) -> torch.Tensor:  # HF-style stock path with bf16 cos/sin tables
        return v * cos + torch.cat([-v[..., D // 2:], v[..., : D // 2]], -1) * sin
    row("rope", "fwd", 2 * n, run.time(lambda: torch_rope(xq)), "ours",
        run.time(lambda: rope_mod.rope_apply(xq, pos, THETA)))
    xqr = xq.clone().requires_grad_(True)
    yr = torch_rope(xqr)
    row("rope", "bwd", 2 * n, run.time(lambda: torch.autograd.grad(yr, (xqr,), dq, retain_graph=True)), "ours",
        run.time(lambda: rope_mod.rope_apply(dq, pos, THETA, inverse=True)))
    xr = x.clone().requires_grad_(True)
    row("silu", "fwd", 2 * n, run.time(lambda: F.silu(x)), "ours", run.time(lambda: silu_mod.silu_forward(x)))
    ys = F.silu(xr)
    row("silu", "bwd", 3 * n, run.time(lambda: torch.autograd.grad(ys, (xr,), dy, retain_graph=True)), "ours",
        run.time(lambda: silu_mod.silu_backward(x, dy)))
    u = rn(R, H)
    ur = u.clone().requires_grad_(True)
    row("swiglu", "fwd", 3 * n, run.time(lambda: F.silu(x) * u), "ours",
        run.time(lambda: swiglu_mod.swiglu_forward(x, u)))
    ysw = F.silu(xr) * ur
    row("swiglu", "bwd", 5 * n, run.time(lambda: torch.autograd.grad(ysw, (xr, ur), dy, retain_graph=True)), "ours",
        run.time(lambda: swiglu_mod.swiglu_backward(x, u, dy)))

    # ---- embedding: torch's backward builds a dense bf16 [V, H] gradient
    def bench_embedding(vocab: int) -> None:
        table = rn(vocab, H)
        ids = torch.randint(0, vocab, (R,), generator=g, device=device)
        tr = table.clone().requires_grad_(True)
        ye = F.embedding(ids, tr)
        mge = torch.zeros(vocab, H, device=device)
        row("embedding", "fwd", 2 * n, run.time(lambda: F.embedding(ids, table)), "ours",
            run.time(lambda: emb_mod.embedding_forward(ids, table)), f"V={vocab}")
        t_torch = run.time(lambda: torch.autograd.grad(ye, (tr,), dy, retain_graph=True))
        step = CanonicalFold(mge, lengths, emb_mod.TILE).take_tiles(rows, (dy, ids))
        tokens, tok_ids = emb_mod.step_tokens(step, ids)
        ida, idb = split_rows(ids, lengths, cut)
        da, db = split_rows(dy, lengths, cut)

        def e2e_chunked() -> None:
            fold = CanonicalFold(mge, lengths, emb_mod.TILE)
            emb_mod.embedding_backward(ida, da, rows_a, fold)
            emb_mod.embedding_backward(idb, db, rows_b, fold)
        nb = n + 4 * n  # read dy (bf16) + read / write the touched fp32 main-grad rows
        row("embedding", "bwd", nb, t_torch, "ours_kernels",
            run.time(lambda: emb_mod.embedding_fold(tokens, tok_ids, dy, dy, mge)), f"V={vocab}")
        row("embedding", "bwd", nb, t_torch, "ours_e2e",
            run.time(lambda: emb_mod.embedding_backward(ids, dy, rows, CanonicalFold(mge, lengths, emb_mod.TILE))),
            f"V={vocab}; fold + plan + uploads + launches")
        row("embedding", "bwd", nb, t_torch, "ours_e2e_chunked", run.time(e2e_chunked), f"V={vocab}; 2 calls")

    for vocab in args.vocab:
        bench_embedding(vocab)

    # ---- pack / unpack: [16, L, H] with L = R // 16 and random lengths in [L/2, L]
    B, L = 16, R // 16
    lens = torch.randint(L // 2, L + 1, (B,), generator=torch.Generator().manual_seed(3))
    xp = rn(B, L, H)
    idx = torch.nonzero((torch.arange(L)[None, :] < lens[:, None]).view(-1).to(device)).view(-1)
    T = int(lens.sum())
    row("pack", "fwd", 2 * T * H * 2, run.time(lambda: xp.view(-1, H).index_select(0, idx)), "ours",
        run.time(lambda: pack_mod.pack(xp, lens)), "torch: index_select with a prebuilt index")
    packed = pack_mod.pack(xp, lens)
    row("unpack", "fwd", 2 * B * L * H * 2,
        run.time(lambda: torch.zeros(B * L, H, device=device, dtype=BF16).index_copy_(0, idx, packed)), "ours",
        run.time(lambda: pack_mod.unpack(packed, lens, L)), "torch: zeros + index_copy_")


def host_planning(run: Run, args: argparse.Namespace, device: torch.device) -> None:
    """Host time per take_tiles call at R rows (CUDA tensors: includes uploads and staging-copy launches)."""
    R, H = args.rows, args.hidden
    lengths = irregular_lengths(R, 13, seed=5)
    _, rows_a, rows_b = chunked(lengths)
    x = torch.empty(R, H, dtype=BF16, device=device)
    xa, xb = x[:rows_a.num_rows], x[rows_a.num_rows:]
    iters = 20 if run.dry else 400

    def per_call(fn: Callable[[], object], calls: int) -> float:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        us = (time.perf_counter() - t) * 1e6 / iters / calls
        if device.type == "cuda":
            torch.cuda.synchronize()
        return us
    mg = torch.zeros(8, device=device)
    ctor = {tile: per_call(lambda tile=tile: CanonicalFold(mg, lengths, tile), 1) for tile in (32, 64)}
    rows = RowIdentity.packed(lengths)
    for tile in (32, 64):
        def packed(tile=tile) -> None:
            CanonicalFold(mg, lengths, tile).take_tiles(rows, (x, x))

        def chunks(tile=tile) -> None:
            fold = CanonicalFold(mg, lengths, tile)
            fold.take_tiles(rows_a, (xa, xa))
            fold.take_tiles(rows_b, (xb, xb))
        for layout, fn, calls in (("packed", packed, 1), ("chunked", chunks, 2)):
            us = per_call(fn, calls) - ctor[tile] / calls
            run.res["host_planning"].append({"layout": layout, "tile": tile, "rows": R, "us_per_call": us,
                                             "fold_ctor_us": ctor[tile], "target_us": 50})
            print(f"host planning {layout:8s} tile {tile:3d}: {us:7.1f} us per call (+ fold ctor {ctor[tile]:.1f} us "
                  f"per step) target < 50", flush=True)
    built = per_call(lambda: RowIdentity.packed(lengths), 1)
    found = per_call(lambda: RowIdentity(rows.sample, rows.position).runs, 1)
    run.res["row_identity"] = {"packed_us": built, "runs_from_rows_us": found}
    print(f"RowIdentity.packed {built:.1f} us; runs found from [R] rows {found:.1f} us (once per RowIdentity)")
    run.save()


# ---------------------------------------------------------------------------------------------- checks
def checks(run: Run, args: argparse.Namespace, device: torch.device) -> None:
    """Every op through check_kernel on this device (default manifest shapes, every layout), and bitwise
    invariance at the bench shape (the contract's bitwise rule) for the folding ops."""
    for op in OPS:
        report = check_kernel(op, f"triton.{op}", device=device)
        run.check(f"{op}: every layout green (default shapes, {device.type})", report.ok, report.first_failure or "")
    lengths = irregular_lengths(args.rows, 13, seed=5)
    bench_shapes = {"rms_norm": {"hidden": args.hidden}, "qk_norm": {"heads": args.heads,
                                                                     "head_dim": args.hidden // args.heads},
                    "embedding": {"vocab": args.vocab[0], "hidden": args.hidden}}
    for op, shape in bench_shapes.items():
        report = check_kernel(op, f"triton.{op}", shape=shape, lengths=lengths, device=device,
                              layouts=["bn_chunked", "bn_permuted"])
        run.check(f"{op}: bench shape {shape}, {args.rows} rows, chunked / permuted", report.ok,
                  report.first_failure or "")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True, help="directory for kernels_i.json")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    ap.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--skip-checks", action="store_true")
    args = ap.parse_args()
    out = Path(args.out_dir)
    if out.exists() and not out.is_dir():
        print(f"bench_kernels_i: error: --out-dir {out} is not a directory", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("bench_kernels_i: error: --dry-run needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        device = torch.device("cpu")
        args.rows, args.hidden, args.heads, args.vocab = 512, 128, 4, [64]
    else:
        if not torch.cuda.is_available():
            print("bench_kernels_i: error: no CUDA device (use --dry-run under TRITON_INTERPRET=1)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
    run = Run(out / "kernels_i.json", args.dry_run)
    run.res["meta"] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu-interpreter",
                       "torch": torch.__version__, "triton": triton.__version__, "host": platform.node(),
                       "shape": {"rows": args.rows, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab},
                       "fast_launch": _common.FAST_LAUNCH}
    try:
        if not args.skip_checks:
            checks(run, args, device)
        speed(run, args, device)
        host_planning(run, args, device)
    finally:
        run.save()
    failed = [c["name"] for c in run.res["checks"] if not c["pass"]]
    print("FAILED CHECKS: " + "; ".join(failed) if failed else "all checks passed", flush=True)
    print(f"wrote {run.path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
