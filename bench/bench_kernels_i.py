"""Speed and bitwise invariance of the first half of the Triton kernels, in one run.

    PYTHONPATH=. python bench/bench_kernels_i.py --out results.json          # CUDA box
    TRITON_INTERPRET=1 PYTHONPATH=. python bench/bench_kernels_i.py --dry-run  # CPU: plumbing only

1. Copy ceiling: a large device-to-device copy (bytes read + written per second).
2. Per op, stock torch vs ours (median of triton.testing.do_bench, which flushes L2 between runs;
   every tensor is >= 128 MiB, well beyond the H200's L2): ms, GB/s, % of the copy ceiling, ratio.
   Bytes counted are the ideal traffic of the op (fwd: read x, write y; bwd: read x, dy, write dx...).
   "kernels" rows run our launchers on a prepared fold plan; "e2e" rows add the host bookkeeping
   (CanonicalFold.take, plan upload) that a training step pays.
3. Bitwise invariance at the bench shape (B=N vs two chunked calls vs permuted samples) and a smoke
   test at the unit-test shapes (accuracy vs float64, B=N / N x B=1 / chunked / padded / permuted).
Imports only torch, triton and gradsweep.canonical / gradsweep.triton_kernels.
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

import torch
import torch.nn.functional as F
import triton

from gradsweep.canonical import CanonicalFold, RowIdentity
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


def timer(dry: bool) -> Callable[[Callable[[], object]], float]:
    if not dry:
        return lambda fn: float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    def wall(fn: Callable[[], object]) -> float:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return wall


# ----------------------------------------------------------------------------------------- layouts
def irregular_lengths(total: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(total - 1, generator=g)[: n - 1].add(1).tolist())
    edges = [0, *cuts, total]
    return [b - a for a, b in itertools.pairwise(edges)]


def layouts(lengths: list[int], small: bool) -> dict[str, list[list[tuple]]]:
    """Calls of pieces (sample, start, stop) or ("pad", n). Chunk cuts avoid tile multiples."""
    n = len(lengths)
    cut = [(3 * m) // 7 + (1 if m > 8 else 0) for m in lengths]
    out = {
        "bn_full": [[(s, 0, lengths[s]) for s in range(n)]],
        "bn_chunked": [[(s, 0, cut[s]) for s in range(n) if cut[s]],
                       [(s, cut[s], lengths[s]) for s in range(n) if cut[s] < lengths[s]]],
        "bn_permuted": [[(s, 0, lengths[s]) for s in reversed(range(n))]],
    }
    if small:
        out["b1_singleton"] = [[(s, 0, lengths[s])] for s in range(n)]
        out["bn_padded"] = [[p for s in range(n) for p in ((s, 0, lengths[s]), ("pad", max(lengths) - lengths[s] + 3))]]
    return out


def physical(call: list[tuple], offsets: list[int], device: torch.device) -> tuple[torch.Tensor, RowIdentity]:
    logical, sample, position = [], [], []
    for piece in call:
        if piece[0] == "pad":
            logical += [-1] * piece[1]
            sample += [-1] * piece[1]
            position += [0] * piece[1]
        else:
            s, a, b = piece
            logical += list(range(offsets[s] + a, offsets[s] + b))
            sample += [s] * (b - a)
            position += list(range(a, b))
    ident = RowIdentity(torch.tensor(sample, dtype=torch.int64), torch.tensor(position, dtype=torch.int64))
    return torch.tensor(logical, dtype=torch.int64, device=device), ident


def gather(t: torch.Tensor, index: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator(device=t.device).manual_seed(seed)
    out = (torch.randn(index.numel(), *t.shape[1:], generator=g, device=t.device) * 50).to(t.dtype)
    real = index >= 0
    out[real] = t[index[real]]
    return out


def run_layout(layout, lengths, inputs: dict[str, torch.Tensor], extra: dict[str, torch.Tensor], fn,
               tile: int | None, fold_shape: tuple[int, ...] | None) -> dict[str, torch.Tensor]:
    """Each call: physical rows gathered from the logical inputs (pads: garbage); ``extra`` (weights)
    is passed as is. Outputs are restored to logical rows; dweight is the fold's main_grad."""
    device = next(iter(inputs.values())).device
    offsets = [0]
    for m in lengths:
        offsets.append(offsets[-1] + m)
    fold = (CanonicalFold(torch.zeros(fold_shape, device=device), lengths, tile) if tile else None)
    res: dict[str, torch.Tensor] = {}
    for k, call in enumerate(layout):
        index, rows = physical(call, offsets, device)
        phys = {name: gather(t, index, 100 + 7 * k + j) for j, (name, t) in enumerate(inputs.items())}
        phys.update(extra)
        for name, t in fn(phys, rows, fold).items():
            if name not in res:
                res[name] = torch.full((offsets[-1], *t.shape[1:]), float("nan"), dtype=t.dtype, device=device)
            real = index >= 0
            res[name][index[real]] = t.detach()[real]
    if fold is not None:
        res["dweight"] = fold.finish().clone()
    return res


def op_fns(heads: int) -> dict[str, tuple[Callable, int | None]]:
    """Per op: fn(phys, rows, fold) -> named outputs/grads, and the fold tile (None: no weight)."""
    def rms(p, rows, fold):
        x = p["x"].clone().requires_grad_(True)
        y = rms_mod.rms_norm(x, p["w"][0], EPS, rows, fold)
        y.backward(p["dy"])
        return {"y": y, "dx": x.grad}

    def qk(p, rows, fold):
        x = p["x"].view(p["x"].shape[0], heads, -1).clone().requires_grad_(True)
        y = qk_mod.qk_norm(x, p["w"][0, : x.shape[2]], EPS, rows, fold)
        y.backward(p["dy"].view_as(x))
        return {"y": y.flatten(1), "dx": x.grad.flatten(1)}

    def rope(p, rows, fold):
        x = p["x"].view(p["x"].shape[0], heads, -1).clone().requires_grad_(True)
        pos = torch.where(rows.sample >= 0, rows.position, torch.full_like(rows.position, 77)).to(x.device)
        y = rope_mod.rope(x, pos, THETA)
        y.backward(p["dy"].view_as(x))
        return {"y": y.flatten(1), "dx": x.grad.flatten(1)}

    def silu(p, rows, fold):
        x = p["x"].clone().requires_grad_(True)
        y = silu_mod.silu(x)
        y.backward(p["dy"])
        return {"y": y, "dx": x.grad}

    def swiglu(p, rows, fold):
        g = p["x"].clone().requires_grad_(True)
        u = p["u"].clone().requires_grad_(True)
        y = swiglu_mod.swiglu(g, u)
        y.backward(p["dy"])
        return {"y": y, "dgate": g.grad, "dup": u.grad}

    def emb(p, rows, fold):
        ids = p["ids"][:, 0] % p["table"].shape[0]  # real ids unchanged; garbage pad ids made valid
        w = p["table"].clone().requires_grad_(True)
        y = emb_mod.embedding(ids, w, rows, fold)
        y.backward(p["dy"])
        return {"y": y}

    return {"rms_norm": (rms, rms_mod.TILE), "qk_norm": (qk, qk_mod.TILE), "rope": (rope, None),
            "silu": (silu, None), "swiglu": (swiglu, None), "embedding": (emb, emb_mod.TILE)}


def make_inputs(op: str, total: int, hidden: int, heads: int, vocab: int, device: torch.device, seed: int):
    """(logical row inputs, extra tensors, fold shape) of one op."""
    g = torch.Generator(device=device).manual_seed(seed)

    def rn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) * scale).to(BF16)

    x, dy = rn(total, hidden, scale=2.0), rn(total, hidden)
    if op in ("rms_norm", "qk_norm"):
        w = (1 + 0.2 * torch.randn(hidden, generator=g, device=device)).to(BF16)
        return {"x": x, "dy": dy}, {"w": w.view(1, -1)}, ((hidden,) if op == "rms_norm" else (hidden // heads,))
    if op == "swiglu":
        return {"x": x, "u": rn(total, hidden), "dy": dy}, {}, None
    if op == "embedding":
        ids = torch.randint(0, vocab, (total, 1), generator=g, device=device)
        return {"ids": ids, "dy": dy}, {"table": rn(vocab, hidden)}, (vocab, hidden)
    return {"x": x, "dy": dy}, {}, None


def invariance_suite(op: str, lengths: list[int], hidden: int, heads: int, vocab: int, small: bool,
                     device: torch.device) -> dict[str, bool]:
    """Layout name -> all outputs / grads / main_grad bitwise equal to bn_full's."""
    inputs, extra, fold_shape = make_inputs(op, sum(lengths), hidden, heads, vocab, device, seed=11)
    fn, tile = op_fns(heads)[op]
    lays = layouts(lengths, small)
    results = {name: run_layout(lay, lengths, inputs, extra, fn, tile, fold_shape) for name, lay in lays.items()}
    if op == "embedding":  # determinism: the same layout twice
        results["bn_chunked_again"] = run_layout(lays["bn_chunked"], lengths, inputs, extra, fn, tile, fold_shape)
    base = results["bn_full"]
    return {name: all(same_bits(res[k], base[k]) for k in base) for name, res in results.items()
            if name != "bn_full"}


# -------------------------------------------------------------------------------------------- smoke
def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a.detach().double() - ref).norm() / ref.norm().clamp_min(1e-300))


def smoke_accuracy(device: torch.device) -> dict[str, float]:
    """Normwise relative error vs float64 at the unit-test shapes, on this device."""
    torch.manual_seed(0)
    R, H, NH, D, V = 130, 96, 3, 32, 50
    out: dict[str, float] = {}
    x = (torch.randn(R, H, device=device) * 2).to(BF16)
    dy = torch.randn(R, H, device=device).to(BF16)
    w = (1 + 0.2 * torch.randn(H, device=device)).to(BF16)
    rows = RowIdentity.packed([R])

    def ref_norm(xx, ww, dd):
        xx = xx.double().requires_grad_(True)
        ww = ww.double().requires_grad_(True)
        y = xx * torch.rsqrt((xx * xx).mean(-1, keepdim=True) + EPS) * ww
        y.backward(dd.double())
        return y.detach(), xx.grad, ww.grad

    fold = CanonicalFold(torch.zeros(H, device=device), [R], rms_mod.TILE)
    xr = x.clone().requires_grad_(True)
    y = rms_mod.rms_norm(xr, w, EPS, rows, fold)
    y.backward(dy)
    ry, rdx, rdw = ref_norm(x, w, dy)
    out.update(rms_y=rel(y, ry), rms_dx=rel(xr.grad, rdx), rms_dw=rel(fold.finish(), rdw))

    xq, dq = x.view(R, NH, D), dy.view(R, NH, D)
    wq = w[:D].contiguous()
    fold = CanonicalFold(torch.zeros(D, device=device), [R], qk_mod.TILE)
    xr = xq.clone().requires_grad_(True)
    y = qk_mod.qk_norm(xr, wq, EPS, rows, fold)
    y.backward(dq)
    ry, rdx, rdw = ref_norm(xq, wq, dq)
    out.update(qk_y=rel(y, ry), qk_dx=rel(xr.grad, rdx), qk_dw=rel(fold.finish(), rdw))

    pos = torch.arange(R, device=device) * 97  # up to ~12.5k: large angles
    xr = xq.clone().requires_grad_(True)
    y = rope_mod.rope(xr, pos, THETA)
    y.backward(dq)
    half = D // 2
    ang = pos.double()[:, None] * THETA ** (-2.0 * torch.arange(half, device=device, dtype=torch.float64) / D)
    c, s = torch.cos(ang)[:, None], torch.sin(ang)[:, None]

    def rot(v, sign):
        v1, v2 = v[..., :half].double(), v[..., half:].double()
        return torch.cat([v1 * c - sign * v2 * s, v2 * c + sign * v1 * s], -1)
    out.update(rope_y=rel(y, rot(xq, 1.0)), rope_dx=rel(xr.grad, rot(dq, -1.0)))

    g64 = x.double().requires_grad_(True)
    u = torch.randn(R, H, device=device).to(BF16)
    u64 = u.double().requires_grad_(True)
    ref = F.silu(g64)
    ref.backward(dy.double())
    xr = x.clone().requires_grad_(True)
    y = silu_mod.silu(xr)
    y.backward(dy)
    out.update(silu_y=rel(y, ref.detach()), silu_dx=rel(xr.grad, g64.grad))
    g64.grad = None
    ref = F.silu(g64) * u64
    ref.backward(dy.double())
    gr, ur = x.clone().requires_grad_(True), u.clone().requires_grad_(True)
    y = swiglu_mod.swiglu(gr, ur)
    y.backward(dy)
    out.update(swiglu_y=rel(y, ref.detach()), swiglu_dgate=rel(gr.grad, g64.grad), swiglu_dup=rel(ur.grad, u64.grad))

    ids = torch.randint(0, V, (R,), device=device)
    table = torch.randn(V, H, device=device).to(BF16).requires_grad_(True)
    fold = CanonicalFold(torch.zeros(V, H, device=device), [R], emb_mod.TILE)
    y = emb_mod.embedding(ids, table, rows, fold)
    y.backward(dy)
    ref = torch.zeros(V, H, device=device, dtype=torch.float64).index_add_(0, ids, dy.double())
    out.update(emb_y_exact=float(not same_bits(y, table.detach()[ids])), emb_dw=rel(fold.finish(), ref))

    lengths = torch.tensor([37, 5, 64, 1, 23])
    xp = torch.randn(5, 64, H, device=device).to(BF16)
    packed = pack_mod.pack(xp, lengths)
    ref = torch.cat([xp[b, : int(n)] for b, n in enumerate(lengths)])
    back = pack_mod.unpack(packed, lengths, 64)
    mask = (torch.arange(64)[None, :] < lengths[:, None]).to(device)
    out.update(pack_exact=float(not same_bits(packed, ref)),
               unpack_exact=float(not same_bits(back, torch.where(mask[..., None], xp, torch.zeros_like(xp)))))
    return out


# -------------------------------------------------------------------------------------------- speed
class Bench:
    def __init__(self, dry: bool, ceiling_gbs: float) -> None:
        self.t = timer(dry)
        self.ceiling = ceiling_gbs
        self.rows: list[dict] = []
        self.errors: list[str] = []

    def safe(self, what: str, fn: Callable | None) -> float:
        """Time fn; a crash is recorded (and printed) instead of ending the run."""
        if fn is None:
            return float("nan")
        try:
            return self.t(fn)
        except Exception as exc:  # one failing row must not lose the others
            self.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            print("ERROR", self.errors[-1], flush=True)
            return float("nan")

    def add(self, op: str, direction: str, nbytes: int, torch_fn: Callable | None, ours: dict[str, Callable],
            note: str = "") -> None:
        t_torch = self.safe(f"{op} {direction} torch", torch_fn)
        for variant, fn in ours.items():
            t = self.safe(f"{op} {direction} {variant}", fn)
            gbs = nbytes / t / 1e6
            self.rows.append({"op": op, "dir": direction, "variant": variant, "bytes": nbytes, "ms": t,
                              "gbs": gbs, "pct_copy": 100 * gbs / self.ceiling, "torch_ms": t_torch,
                              "torch_gbs": nbytes / t_torch / 1e6,
                              "torch_pct_copy": 100 * nbytes / t_torch / 1e6 / self.ceiling,
                              "ratio_vs_torch": t / t_torch, "note": note})
            r = self.rows[-1]
            print(f"{op:10s} {direction:4s} {variant:22s} {t:8.4f} ms {gbs:8.1f} GB/s {r['pct_copy']:6.1f}% "
                  f"| torch {t_torch:8.4f} ms {r['torch_pct_copy']:6.1f}% | ours/torch {r['ratio_vs_torch']:5.2f}",
                  flush=True)


def copy_ceiling(t: Callable, device: torch.device, n_bytes: int) -> float:
    src = torch.empty(n_bytes // 2, dtype=BF16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = t(lambda: dst.copy_(src))
    return 2 * n_bytes / ms / 1e6  # GB/s, read + write


def speed(args: argparse.Namespace, device: torch.device, res: dict) -> None:
    t = timer(args.dry_run)
    R, H, NH = args.rows, args.hidden, args.heads
    D = H // NH
    big = 1 << 30 if not args.dry_run else 1 << 20
    ceil = copy_ceiling(t, device, big)
    same = copy_ceiling(t, device, R * H * 2)
    res["ceiling"] = {"copy_gbs": ceil, "copy_bytes_each_way": big, "copy_same_size_gbs": same,
                      "same_size_bytes_each_way": R * H * 2, "hbm_spec_gbs": 4800.0}
    print(f"copy ceiling: {ceil:.1f} GB/s (1 GiB each way); same-size copy ({R}x{H} bf16): {same:.1f} GB/s",
          flush=True)
    b = Bench(args.dry_run, ceil)
    g = torch.Generator(device=device).manual_seed(0)
    rn = lambda *s: torch.randn(*s, generator=g, device=device).to(BF16)  # noqa: E731
    n = R * H * 2  # bytes of one [R, H] bf16 tensor
    lengths = irregular_lengths(R, 13, seed=5)
    rows = RowIdentity.packed(lengths)

    # rms_norm
    x, dy, dx = rn(R, H), rn(R, H), torch.empty(R, H, device=device, dtype=BF16)
    w = (1 + 0.1 * rn(H).float()).to(BF16)
    b.add("rms_norm", "fwd", 2 * n, lambda: F.rms_norm(x, (H,), w, EPS),
          {"ours": lambda: rms_mod.rms_norm_forward(x, w, EPS)})
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    yt = F.rms_norm(xr, (H,), wr, EPS)
    mg = torch.zeros(H, device=device)
    step = CanonicalFold(mg, lengths, rms_mod.TILE).take(rows, (x, dy))
    parts = torch.empty(step.num_tiles, H, device=device)

    def rms_kernels() -> None:
        rms_mod._launch_bwd(step.plan, x, dy, w, dx, parts, 0, EPS, True, True)
        _common.fold_partials(parts, mg)

    def rms_e2e() -> None:
        rms_mod.rms_norm_backward(x, w, dy, EPS, rows, CanonicalFold(mg, lengths, rms_mod.TILE))

    def rms_variant(block_rows: int, warps: int, stages: int) -> Callable[[], None]:
        """Another pinned config (speed exploration only: a config change may change dx bits)."""
        def fn() -> None:
            saved = rms_mod.row_config, rms_mod.BWD_STAGES
            rms_mod.row_config = lambda h, tile: (triton.next_power_of_2(h), block_rows, warps)
            rms_mod.BWD_STAGES = stages
            try:
                rms_kernels()
            finally:
                rms_mod.row_config, rms_mod.BWD_STAGES = saved
        return fn

    b.add("rms_norm", "bwd", 3 * n, lambda: torch.autograd.grad(yt, (xr, wr), dy, retain_graph=True),
          {"ours_kernels": rms_kernels, "ours_e2e": rms_e2e, "fold_only": lambda: _common.fold_partials(parts, mg),
           "v_stages1_w8": rms_variant(1, 8, 1), "v_stages2_w8": rms_variant(1, 8, 2),
           "v_stages3_w16": rms_variant(1, 16, 3), "v_rows2_w16_s3": rms_variant(2, 16, 3),
           "v_stages4_w8": rms_variant(1, 8, 4)},
          note=f"{step.num_tiles} canonical tiles of {rms_mod.TILE}; fold reads/writes {step.num_tiles * H * 4} B")

    # qk_norm on [R, NH, D]
    xq, dq, dxq = x.view(R, NH, D), dy.view(R, NH, D), dx.view(R, NH, D)
    wq = w[:D].contiguous()
    b.add("qk_norm", "fwd", 2 * n, lambda: F.rms_norm(xq, (D,), wq, EPS),
          {"ours": lambda: qk_mod.qk_norm_forward(xq, wq, EPS)})
    xqr, wqr = xq.clone().requires_grad_(True), wq.clone().requires_grad_(True)
    yq = F.rms_norm(xqr, (D,), wqr, EPS)
    mgq = torch.zeros(D, device=device)
    stepq = CanonicalFold(mgq, lengths, qk_mod.TILE).take(rows, (xq, dq))
    partq = torch.empty(stepq.num_tiles, D, device=device)

    def qk_kernels() -> None:
        qk_mod._launch_bwd(stepq.plan, xq, dq, wq, dxq, partq, 0, EPS, True, True)
        _common.fold_partials(partq, mgq)
    b.add("qk_norm", "bwd", 3 * n, lambda: torch.autograd.grad(yq, (xqr, wqr), dq, retain_graph=True),
          {"ours_kernels": qk_kernels})

    # rope, HF-style stock path with bf16 cos/sin tables (built outside the timing)
    pos = torch.cat([torch.arange(m) for m in lengths]).to(device)
    inv = THETA ** (-torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    ang = pos.float()[:, None] * inv[None, :]
    cos = torch.cat([ang, ang], -1).cos().to(BF16)[:, None, :]
    sin = torch.cat([ang, ang], -1).sin().to(BF16)[:, None, :]

    def torch_rope(v: torch.Tensor) -> torch.Tensor:
        v1, v2 = v[..., : D // 2], v[..., D // 2:]
        return v * cos + torch.cat([-v2, v1], -1) * sin
    b.add("rope", "fwd", 2 * n, lambda: torch_rope(xq), {"ours": lambda: rope_mod.rope_apply(xq, pos, THETA)})
    yr = torch_rope(xqr)
    b.add("rope", "bwd", 2 * n, lambda: torch.autograd.grad(yr, (xqr,), dq, retain_graph=True),
          {"ours": lambda: rope_mod.rope_apply(dq, pos, THETA, inverse=True)})

    # silu, swiglu (gate/up [R, H])
    b.add("silu", "fwd", 2 * n, lambda: F.silu(x), {"ours": lambda: silu_mod.silu_forward(x)})
    ys = F.silu(xr)
    b.add("silu", "bwd", 3 * n, lambda: torch.autograd.grad(ys, (xr,), dy, retain_graph=True),
          {"ours": lambda: silu_mod.silu_backward(x, dy)})
    u = rn(R, H)
    ur = u.clone().requires_grad_(True)
    b.add("swiglu", "fwd", 3 * n, lambda: F.silu(x) * u, {"ours": lambda: swiglu_mod.swiglu_forward(x, u)})
    ysw = F.silu(xr) * ur
    b.add("swiglu", "bwd", 5 * n, lambda: torch.autograd.grad(ysw, (xr, ur), dy, retain_graph=True),
          {"ours": lambda: swiglu_mod.swiglu_backward(x, u, dy)})

    # embedding (uniform ids); torch's backward builds a dense bf16 [V, H] gradient
    def bench_embedding(vocab: int) -> None:
        table = rn(vocab, H)
        ids = torch.randint(0, vocab, (R,), generator=g, device=device)
        tr = table.clone().requires_grad_(True)
        ye = F.embedding(ids, tr)
        mge = torch.zeros(vocab, H, device=device)
        stepe = CanonicalFold(mge, lengths, emb_mod.TILE).take(rows, (dy, ids))
        toks = stepe.plan.view(-1).long()
        b.add("embedding", "fwd", 2 * n, lambda: F.embedding(ids, table),
              {"ours": lambda: emb_mod.embedding_forward(ids, table)}, note=f"V={vocab}")
        b.add("embedding", "bwd", n + 4 * n, lambda: torch.autograd.grad(ye, (tr,), dy, retain_graph=True),
              {"ours_kernels": lambda: emb_mod.embedding_fold(toks, ids, dy, mge),
               "ours_e2e": lambda: emb_mod.embedding_backward(ids, dy, rows, CanonicalFold(mge, lengths, 1))},
              note=f"V={vocab}; bytes: read dy (bf16) + read/write the touched fp32 main_grad rows")

    for vocab in args.vocab:
        bench_embedding(vocab)

    # pack / unpack: [16, L, H] with L = R // 16 and random lengths in [L/2, L]
    B, L = 16, R // 16
    lens = torch.randint(L // 2, L + 1, (B,), generator=torch.Generator().manual_seed(3))
    xp = rn(B, L, H)
    mask = (torch.arange(L)[None, :] < lens[:, None]).view(-1).to(device)
    idx = torch.nonzero(mask).view(-1)
    T = int(lens.sum())
    b.add("pack", "fwd", 2 * T * H * 2, lambda: xp.view(-1, H).index_select(0, idx),
          {"ours": lambda: pack_mod.pack(xp, lens)}, note="torch: index_select with a prebuilt index")
    packed = pack_mod.pack(xp, lens)
    b.add("unpack", "fwd", 2 * B * L * H * 2,
          lambda: torch.zeros(B * L, H, device=device, dtype=BF16).index_copy_(0, idx, packed),
          {"ours": lambda: pack_mod.unpack(packed, lens, L)}, note="torch: zeros + index_copy_")
    res["ops"] = b.rows
    res["speed_errors"] = b.errors


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="kernels_i.json")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 128256])
    ap.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--dry-run needs TRITON_INTERPRET=1", file=sys.stderr)
            return 2
        device = torch.device("cpu")
        args.rows, args.hidden, args.heads, args.vocab = 256, 128, 4, [64]
    else:
        if not torch.cuda.is_available():
            print("no CUDA device (use --dry-run under TRITON_INTERPRET=1 for a plumbing check)", file=sys.stderr)
            return 2
        device = torch.device("cuda")
    res: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu-interpreter",
                 "torch": torch.__version__, "triton": triton.__version__, "host": platform.node(),
                 "shape": {"rows": args.rows, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab},
                 "interpret": _common.INTERPRET}
    failures: list[str] = []

    # smoke: accuracy at the unit-test shapes on this device
    try:
        acc = smoke_accuracy(device)
    except Exception as exc:
        acc = {}
        failures.append(f"smoke crashed: {type(exc).__name__}: {exc}")
        print("ERROR", failures[-1], flush=True)
    res["smoke_accuracy"] = acc
    bad = {k: v for k, v in acc.items() if not (v < 2e-2)}
    print("smoke accuracy (normwise rel. err vs fp64; *_exact: 0 = bit-exact):",
          " ".join(f"{k}={v:.2e}" for k, v in acc.items()), flush=True)
    failures += [f"accuracy {k}" for k in bad]

    # invariance: unit-test shapes (all layouts) and the bench shape (B=N vs chunked vs permuted)
    small_lengths = [37, 5, 64, 1, 23]
    big_lengths = irregular_lengths(args.rows, 13, seed=5)
    inv: dict[str, dict[str, dict[str, bool]]] = {"small": {}, "bench": {}}
    for op in ("rms_norm", "qk_norm", "rope", "silu", "swiglu", "embedding"):
        for scale, (lens, hid, nh, voc, small) in {
                "small": (small_lengths, 96, 3, 50, True),
                "bench": (big_lengths, args.hidden, args.heads, args.vocab[0], False)}.items():
            try:
                inv[scale][op] = invariance_suite(op, lens, hid, nh, voc, small, device)
            except Exception as exc:
                inv[scale][op] = {f"crashed: {type(exc).__name__}: {exc}": False}
        for scale in ("small", "bench"):
            print(f"invariance {scale:5s} {op:10s}", inv[scale][op], flush=True)
            failures += [f"invariance {scale} {op} {k}" for k, ok in inv[scale][op].items() if not ok]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    res["invariance"] = inv

    if not args.skip_speed:
        try:
            speed(args, device, res)
        except Exception as exc:
            failures.append(f"speed crashed: {type(exc).__name__}: {exc}")
            print("ERROR", failures[-1], flush=True)
    res["failures"] = failures
    print("FAILURES:" if failures else "all invariance / accuracy checks passed", failures or "", flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1, default=lambda o: None if isinstance(o, float) and math.isnan(o) else str(o))
    print(f"wrote {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
