"""GPU check of the CUDA family (gradsweep._C): invariance, accuracy, speed. Run on a CUDA box.

    python bench/gpu_check_cuda.py --out cuda_check.json [--quick]

Builds nothing (``pip install -e .`` must have built gradsweep._C). Invariance is bitwise (raw bits
compared), layouts after logical restore: one packed call, N single-sample calls (in order and
reversed), irregular chunks, right/left padding with junk in the pads, permuted samples, shuffled rows,
misaligned buffers (scalar path vs 16-byte path). Accuracy is against a float64 reference with a
numerical-analysis bound (bf16 output rounding 2^-8 relative + FP32 error terms), no free tolerance.
Timing: each op vs torch and vs the copy bandwidth measured in the same run at 16384 x 4096 bf16.
Imports only torch, gradsweep.canonical and gradsweep.cuda_kernels (the GPU tests reuse CHECKS).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
import traceback
from collections.abc import Callable

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import cuda_status
from gradsweep.cuda_kernels import rms_norm as crms
from gradsweep.cuda_kernels import rope as crope
from gradsweep.cuda_kernels import silu as csilu
from gradsweep.cuda_kernels import swiglu as cswiglu

U16 = 2.0**-8  # bf16 unit roundoff (8-bit significand, round to nearest)
U32 = 2.0**-24  # fp32 unit roundoff
TINY = 1e-37  # below every normal bf16/fp32 magnitude used here
LENGTHS = [5, 70, 1, 130, 64, 33]  # crosses 64-token tile boundaries, a 1-token sample, an exact tile
EPS = 1e-6
THETA = 10000.0
DEV = "cuda"  # a module variable so the plumbing can be dry-run elsewhere with a stand-in device

Result = tuple[bool, str]


# ----------------------------------------------------------------------------------------------- helpers
def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits of a bf16 / fp32 tensor (NaNs compare by payload: stricter than NaN-aware)."""
    t = t.detach().contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, str]:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
    diff = bits(a) != bits(b)
    n = int(diff.sum())
    if n == 0:
        return True, "bitwise equal"
    first = diff.flatten().nonzero()[0].item()
    return False, (f"{n}/{diff.numel()} elements differ (first flat index {first}: "
                   f"{a.flatten()[first].item()!r} vs {b.flatten()[first].item()!r})")


def within(name: str, got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> tuple[bool, str]:
    """|got - ref| <= bound elementwise (float64); reports the worst ratio error / bound."""
    err = (got.double() - ref).abs()
    bad = ~(err <= bound)  # NaN fails
    ratio = (err / bound.clamp_min(1e-300)).max().item() if err.numel() else 0.0
    rel = (err.max() / ref.abs().max().clamp_min(1e-300)).item() if err.numel() else 0.0
    worst = err.max().item() if err.numel() else 0.0
    msg = f"{name}: max err/bound {ratio:.3g}, max abs {worst:.3g}, rel {rel:.3g}"
    return not bool(bad.any()), msg


def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def randn(shape: tuple[int, ...], seed: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen(seed)) * scale + shift).to(torch.bfloat16).to(DEV)


def offsets(lengths: list[int]) -> list[int]:
    out, acc = [], 0
    for n in lengths:
        out.append(acc)
        acc += n
    return out


Call = tuple[list[int], list[int]]  # (sample per physical row, position per physical row); -1 = pad


def layouts(lengths: list[int]) -> dict[str, list[Call]]:
    """Physical layouts of the same logical samples (each a list of calls)."""
    n = len(lengths)
    packed_s = [s for s in range(n) for _ in range(lengths[s])]
    packed_p = [p for s in range(n) for p in range(lengths[s])]
    total = len(packed_s)
    cuts = sorted({0, total, *[c for c in (3, 40, 41, 150, 151, 200, 290) if c < total]})
    lmax = max(lengths)
    right = ([], [])
    left = ([], [])
    for s in range(n):
        pad = lmax - lengths[s]
        right[0].extend([s] * lengths[s] + [-1] * pad)
        right[1].extend(list(range(lengths[s])) + [0] * pad)
        left[0].extend([-1] * pad + [s] * lengths[s])
        left[1].extend([0] * pad + list(range(lengths[s])))
    perm = [3, 0, 5, 1, 4, 2][:n] if n == 6 else list(reversed(range(n)))
    shuffle = torch.randperm(total, generator=gen(7)).tolist()
    return {
        "bn_full": [(packed_s, packed_p)],
        "b1_singleton": [([s] * lengths[s], list(range(lengths[s]))) for s in range(n)],
        "b1_reversed": [([s] * lengths[s], list(range(lengths[s]))) for s in reversed(range(n))],
        "bn_chunked": [(packed_s[a:b], packed_p[a:b]) for a, b in itertools.pairwise(cuts)],
        "bn_padded_right": [right],
        "bn_padded_left": [left],
        "bn_permuted": [([s for s in perm for _ in range(lengths[s])],
                         [p for s in perm for p in range(lengths[s])])],
        "bn_rows_shuffled": [([packed_s[i] for i in shuffle], [packed_p[i] for i in shuffle])],
    }


def place(table: torch.Tensor, call: Call, offs: list[int], junk_seed: int,
          misalign: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Physical tensor of a call from the logical table (pads get junk), its real-row mask, logical index."""
    real = torch.tensor(call[0], dtype=torch.int64) >= 0
    logical = torch.tensor([offs[a] + b for a, b in zip(call[0], call[1]) if a >= 0], dtype=torch.int64)
    shape = (len(call[0]), *table.shape[1:])
    if misalign:  # same values, storage one element off 16-byte alignment: the kernels' scalar path
        flat = torch.empty(math.prod(shape) + 1, dtype=table.dtype, device=table.device)
        phys = flat[1:].view(shape)
    else:
        phys = torch.empty(shape, dtype=table.dtype, device=table.device)
    phys.copy_(randn(shape, junk_seed, scale=50.0))
    real_d = real.to(DEV)
    if logical.numel():
        phys[real_d] = table[logical.to(DEV)]
    return phys, real_d, logical.to(DEV)


# ----------------------------------------------------------------------------------------------- rms_norm
def rms_run(calls: list[Call], X: torch.Tensor, W: torch.Tensor, DY: torch.Tensor, mg0: torch.Tensor,
            misalign: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, dx) in logical order and the final main_grad, for one layout."""
    offs = offsets(LENGTHS)
    fold = CanonicalFold(mg0.clone(), LENGTHS, crms.TILE)
    Y = torch.full_like(X, float("nan"))
    DX = torch.full_like(X, float("nan"))
    for k, call in enumerate(calls):
        x, real, logical = place(X, call, offs, 1000 + k, misalign)
        dy, _, _ = place(DY, call, offs, 2000 + k, misalign)
        rows = RowIdentity(torch.tensor(call[0], dtype=torch.int64), torch.tensor(call[1], dtype=torch.int64))
        x.requires_grad_(True)
        y = crms.rms_norm(x, W, EPS, rows, fold)
        y.backward(dy)
        Y[logical] = y.detach()[real]
        DX[logical] = x.grad[real]
    return Y, DX, fold.finish()


def rms_data(hidden: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    T = sum(LENGTHS)
    X = randn((T, hidden), 11)
    W = randn((hidden,), 12, scale=0.3, shift=1.0)
    DY = randn((T, hidden), 13)
    mg0 = torch.randn(hidden, generator=gen(14)).to(DEV)
    return X, W, DY, mg0


def check_rms_invariance(hidden: int) -> Result:
    X, W, DY, mg0 = rms_data(hidden)
    lay = layouts(LENGTHS)
    base = rms_run(lay["bn_full"], X, W, DY, mg0)
    runs = {name: (calls, False) for name, calls in lay.items() if name != "bn_full"}
    runs["bn_full_misaligned"] = (lay["bn_full"], True)
    runs["bn_chunked_misaligned"] = (lay["bn_chunked"], True)
    msgs = []
    ok_all = True
    for name, (calls, mis) in runs.items():
        got = rms_run(calls, X, W, DY, mg0, misalign=mis)
        for tname, a, b in zip(("y", "dx", "dweight"), base, got):
            ok, msg = same_bits(a, b)
            if not ok:
                ok_all = False
                msgs.append(f"{name}/{tname}: {msg}")
    if msgs:
        return False, "; ".join(msgs)
    return ok_all, f"{len(runs)} layouts bitwise equal to bn_full (y, dx, dweight)"


def check_rms_rowwise(hidden: int) -> Result:
    """A row's forward and dx bits do not depend on R (1, 3, 1000)."""
    X = randn((1000, hidden), 21)
    W = randn((hidden,), 22, scale=0.3, shift=1.0)
    DY = randn((1000, hidden), 23)
    y_all, r_all = crms.rms_norm_forward(X, W, EPS)
    dx_all = crms.rms_norm_dx(DY, X, W, r_all)
    msgs = []
    for lo, hi in ((0, 1), (0, 3), (997, 1000), (500, 501)):
        y, r = crms.rms_norm_forward(X[lo:hi].contiguous(), W, EPS)
        dx = crms.rms_norm_dx(DY[lo:hi].contiguous(), X[lo:hi].contiguous(), W, r)
        for tname, a, b in (("y", y, y_all[lo:hi]), ("rstd", r, r_all[lo:hi]), ("dx", dx, dx_all[lo:hi])):
            ok, msg = same_bits(a, b)
            if not ok:
                msgs.append(f"R={hi - lo} rows {lo}:{hi} {tname}: {msg}")
    return not msgs, "; ".join(msgs) if msgs else "R in {1, 3, 1000}: bitwise equal"


def check_rms_accuracy(hidden: int) -> Result:
    X, W, DY, mg0 = rms_data(hidden)
    y, dx, mg = rms_run(layouts(LENGTHS)["bn_full"], X, W, DY, mg0)
    x, w, g = X.double(), W.double(), DY.double()
    H = hidden
    r = torch.rsqrt((x * x).mean(1, keepdim=True) + EPS)
    y_ref = x * r * w
    gw = g * w
    c = (gw * x).sum(1, keepdim=True)
    dx_ref = r * gw - x * r**3 * c / H
    contrib = g * x * r
    mg_ref = mg0.double() + contrib.sum(0)
    T = x.shape[0]
    b_y = (U16 + (H + 8) * U32) * y_ref.abs() * 1.01 + TINY
    a_dx = r * (gw.abs() + x.abs() * r**2 * (gw * x).abs().sum(1, keepdim=True) / H)
    b_dx = U16 * dx_ref.abs() * 1.01 + (2 * H + 16) * U32 * a_dx + TINY
    b_mg = (T + H + 16) * U32 * (mg0.double().abs() + contrib.abs().sum(0)) + TINY
    res = [within("y", y, y_ref, b_y), within("dx", dx, dx_ref, b_dx), within("dweight", mg, mg_ref, b_mg)]
    return all(ok for ok, _ in res), "; ".join(m for _, m in res)


def check_rms_empty() -> Result:
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=DEV, requires_grad=True)
    w = torch.ones(64, dtype=torch.bfloat16, device=DEV)
    fold = CanonicalFold(torch.zeros(64, device=DEV), [], crms.TILE)
    rows = RowIdentity(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    y = crms.rms_norm(x, w, EPS, rows, fold)
    y.backward(torch.empty_like(y))
    ok = y.shape == (0, 64) and x.grad is not None and x.grad.shape == (0, 64) and fold.done
    return ok, f"R=0: y {tuple(y.shape)}, fold done={fold.done}"


# ----------------------------------------------------------------------------------------------- pointwise
PW_CUTS = [0, 1, 13, 8 * 37, 8 * 37 + 5, 3001, 4096, 7777]  # irregular: misaligned views and ragged tails


def pw_chunked(fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], dy: torch.Tensor,
               cuts: list[int]) -> list[torch.Tensor]:
    """Output and input grads of fn over the flattened tensors, computed chunk by chunk."""
    n = inputs[0].numel()
    cuts = sorted({c for c in cuts if c <= n} | {0, n})
    outs: list[list[torch.Tensor]] = [[] for _ in range(1 + len(inputs))]
    for a, b in itertools.pairwise(cuts):
        parts = [t.flatten()[a:b].detach().requires_grad_(True) for t in inputs]  # views: offset a
        y = fn(*parts)
        y.backward(dy.flatten()[a:b])
        outs[0].append(y.detach())
        for i, p in enumerate(parts):
            outs[1 + i].append(p.grad)
    return [torch.cat(o) for o in outs]


def check_pointwise_invariance(op: str) -> Result:
    fn = csilu.silu if op == "silu" else cswiglu.swiglu
    n_in = 1 if op == "silu" else 2
    inputs = [randn((7777,), 31 + i, scale=4.0) for i in range(n_in)]
    dy = randn((7777,), 39)
    full = pw_chunked(fn, inputs, dy, [])
    msgs = []
    for name, cuts in (("chunked", PW_CUTS), ("singletons", [*range(64), 64, 7000, 7001])):
        got = pw_chunked(fn, inputs, dy, cuts)
        for k, (a, b) in enumerate(zip(full, got)):
            ok, msg = same_bits(a, b)
            if not ok:
                msgs.append(f"{name}/{'y' if k == 0 else f'grad{k - 1}'}: {msg}")
    # 2-D rows vs one row at a time, and R = 0
    rows_in = [randn((37, 96), 41 + i, scale=4.0) for i in range(n_in)]
    y_all = fn(*rows_in)
    for r in (0, 1, 36):
        ok, msg = same_bits(fn(*[t[r:r + 1] for t in rows_in]), y_all[r:r + 1])
        if not ok:
            msgs.append(f"row {r}: {msg}")
    empty = fn(*[torch.empty(0, 8, dtype=torch.bfloat16, device=DEV) for _ in range(n_in)])
    if empty.shape != (0, 8):
        msgs.append("R=0 failed")
    return not msgs, "; ".join(msgs) if msgs else "chunked / singleton / row-wise / misaligned: bitwise equal"


def check_pointwise_accuracy(op: str) -> Result:
    n = 1 << 16
    g = randn((n,), 51, scale=6.0)
    u = randn((n,), 52, scale=2.0)
    dy = randn((n,), 53)
    gd, ud, dyd = g.double(), u.double(), dy.double()
    s = torch.sigmoid(gd)
    oms = torch.sigmoid(-gd)
    dsilu = s * (1 + gd * oms)
    a_ds = s * (1 + gd.abs() * oms)
    if op == "silu":
        x = g.detach().requires_grad_(True)
        y = csilu.silu(x)
        y.backward(dy)
        y_ref = gd * s
        dx_ref = dyd * dsilu
        res = [within("y", y, y_ref, (U16 + 16 * U32) * y_ref.abs() * 1.01 + TINY),
               within("dx", x.grad, dx_ref, U16 * dx_ref.abs() * 1.01 + 16 * U32 * dyd.abs() * a_ds + TINY)]
    else:
        a = g.detach().requires_grad_(True)
        b = u.detach().requires_grad_(True)
        y = cswiglu.swiglu(a, b)
        y.backward(dy)
        y_ref = gd * s * ud
        dg_ref = dyd * ud * dsilu
        du_ref = dyd * gd * s
        res = [within("y", y, y_ref, (U16 + 16 * U32) * y_ref.abs() * 1.01 + TINY),
               within("dgate", a.grad, dg_ref,
                      U16 * dg_ref.abs() * 1.01 + 16 * U32 * (dyd * ud).abs() * a_ds + TINY),
               within("dup", b.grad, du_ref, (U16 + 16 * U32) * du_ref.abs() * 1.01 + TINY)]
    return all(ok for ok, _ in res), "; ".join(m for _, m in res)


# ----------------------------------------------------------------------------------------------- rope
def rope_run(calls: list[Call], X: torch.Tensor, DY: torch.Tensor, misalign: bool = False,
             pos_shift: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    offs = offsets(LENGTHS)
    Y = torch.full_like(X, float("nan"))
    DX = torch.full_like(X, float("nan"))
    for k, call in enumerate(calls):
        x, real, logical = place(X, call, offs, 3000 + k, misalign)
        dy, _, _ = place(DY, call, offs, 4000 + k, misalign)
        pos = torch.tensor(call[1], dtype=torch.int64) + pos_shift
        x.requires_grad_(True)
        y = crope.rope(x, pos, THETA)
        y.backward(dy)
        Y[logical] = y.detach()[real]
        DX[logical] = x.grad[real]
    return Y, DX


def check_rope_invariance(heads: int, head_dim: int) -> Result:
    T = sum(LENGTHS)
    X = randn((T, heads, head_dim), 61)
    DY = randn((T, heads, head_dim), 62)
    lay = layouts(LENGTHS)
    base = rope_run(lay["bn_full"], X, DY)
    msgs = []
    runs = {name: (calls, False) for name, calls in lay.items() if name != "bn_full"}
    runs["bn_full_misaligned"] = (lay["bn_full"], True)
    for name, (calls, mis) in runs.items():
        got = rope_run(calls, X, DY, misalign=mis)
        for tname, a, b in zip(("y", "dx"), base, got):
            ok, msg = same_bits(a, b)
            if not ok:
                msgs.append(f"{name}/{tname}: {msg}")
    return not msgs, "; ".join(msgs) if msgs else f"{len(runs)} layouts bitwise equal to bn_full (y, dx)"


def check_rope_accuracy(heads: int, head_dim: int, pos_shift: int) -> Result:
    T = sum(LENGTHS)
    X = randn((T, heads, head_dim), 71)
    DY = randn((T, heads, head_dim), 72)
    y, dx = rope_run(layouts(LENGTHS)["bn_full"], X, DY, pos_shift=pos_shift)
    pos = torch.tensor([p for s in range(len(LENGTHS)) for p in range(LENGTHS[s])], dtype=torch.float64)
    pos = (pos + pos_shift).to(DEV)
    half = head_dim // 2
    i = torch.arange(half, dtype=torch.float64, device=DEV)
    ang = pos[:, None] * THETA ** (-2.0 * i / head_dim)  # [T, half]
    c, s = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rot(t: torch.Tensor, sign: float) -> tuple[torch.Tensor, torch.Tensor]:
        t1, t2 = t[..., :half].double(), t[..., half:].double()
        out = torch.cat([t1 * c - sign * t2 * s, t2 * c + sign * t1 * s], -1)
        mag = (t1.abs() + t2.abs()).repeat(1, 1, 2)
        return out, mag

    y_ref, mag_x = rot(X, 1.0)
    dx_ref, mag_g = rot(DY, -1.0)
    a_ang = ang.abs()[:, None, :].repeat(1, 1, 2)
    b_y = U16 * y_ref.abs() * 1.01 + mag_x * (32 * U32 * a_ang + 16 * U32) + TINY
    b_dx = U16 * dx_ref.abs() * 1.01 + mag_g * (32 * U32 * a_ang + 16 * U32) + TINY
    res = [within("y", y, y_ref, b_y), within("dx", dx, dx_ref, b_dx)]
    return all(ok for ok, _ in res), "; ".join(m for _, m in res)


CHECKS: dict[str, Callable[[], Result]] = {
    "rms_norm/invariance/H4096": lambda: check_rms_invariance(4096),
    "rms_norm/invariance/H1000": lambda: check_rms_invariance(1000),
    "rms_norm/invariance/H100": lambda: check_rms_invariance(100),  # H % 8 != 0: scalar path
    "rms_norm/rowwise/H4096": lambda: check_rms_rowwise(4096),
    "rms_norm/rowwise/H100": lambda: check_rms_rowwise(100),
    "rms_norm/accuracy/H4096": lambda: check_rms_accuracy(4096),
    "rms_norm/accuracy/H100": lambda: check_rms_accuracy(100),
    "rms_norm/empty": check_rms_empty,
    "silu/invariance": lambda: check_pointwise_invariance("silu"),
    "silu/accuracy": lambda: check_pointwise_accuracy("silu"),
    "swiglu/invariance": lambda: check_pointwise_invariance("swiglu"),
    "swiglu/accuracy": lambda: check_pointwise_accuracy("swiglu"),
    "rope/invariance/h8d128": lambda: check_rope_invariance(8, 128),
    "rope/invariance/h3d10": lambda: check_rope_invariance(3, 10),  # half % 8 != 0: scalar path
    "rope/accuracy/h8d128": lambda: check_rope_accuracy(8, 128, 0),
    "rope/accuracy/h8d128/pos32k": lambda: check_rope_accuracy(8, 128, 32000),
    "rope/accuracy/h4d64/pos200k": lambda: check_rope_accuracy(4, 64, 200000),  # sincosf slow path
}


# ----------------------------------------------------------------------------------------------- timing
def time_ms(fn: Callable[[], object], iters: int) -> float:
    """Median milliseconds of fn over iters runs (CUDA events), after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def torch_rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = pos.float()[:, None] * inv[None, :]
    c, s = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)


def timings(rows: int, hidden: int, iters: int) -> tuple[float, list[dict]]:
    """(copy GB/s, one dict per timed kernel)."""
    F = torch.nn.functional
    x = randn((rows, hidden), 81)
    y = torch.empty_like(x)
    nbytes = x.numel() * x.element_size()
    copy_ms = time_ms(lambda: y.copy_(x), iters)
    copy_gbps = 2 * nbytes / copy_ms / 1e6
    w = randn((hidden,), 82, scale=0.3, shift=1.0)
    dy = randn((rows, hidden), 83)
    u = randn((rows, hidden), 84)
    _, rstd = crms.rms_norm_forward(x, w, EPS)
    # dweight kernels on a precomputed plan (the host-side fold.take is timed separately)
    fold = CanonicalFold(torch.zeros(hidden, device=DEV), [rows], crms.TILE)
    rows_id = RowIdentity.packed([rows])
    t0 = time.perf_counter()
    step = fold.take(rows_id, (dy, x, rstd))
    take_ms = (time.perf_counter() - t0) * 1e3
    plan = step.plan
    partial = torch.empty((step.num_tiles, hidden), dtype=torch.float32, device=DEV)
    ext = crms.rt.ext()
    dev, stream = crms.rt.launch(x)
    mg = torch.zeros(hidden, device=DEV)

    def dweight() -> None:
        ext.rms_norm_dw_tiles(plan.data_ptr(), step.num_tiles, plan.shape[1], dy.data_ptr(), x.data_ptr(),
                              rstd.data_ptr(), partial.data_ptr(), hidden, dev, stream)
        ext.fold_tiles(partial.data_ptr(), step.num_tiles, mg.data_ptr(), hidden, dev, stream)

    heads, hd = hidden // 128, 128
    xr = x.view(rows, heads, hd)
    dyr = dy.view(rows, heads, hd)
    pos = torch.arange(rows, device=DEV, dtype=torch.int64)
    xg = x.detach().requires_grad_(True)
    wg = w.detach().requires_grad_(True)
    ug = u.detach().requires_grad_(True)
    xrg = xr.detach().requires_grad_(True)

    def torch_bwd(out_fn: Callable[[], torch.Tensor], inputs: list[torch.Tensor], grad: torch.Tensor):
        out = out_fn()
        return lambda: torch.autograd.grad(out, inputs, grad, retain_graph=True)

    cases = [
        # (op, phase, ours, torch, bytes moved by ours)
        ("rms_norm", "fwd", lambda: crms.rms_norm_forward(x, w, EPS),
         lambda: F.rms_norm(x, (hidden,), w, EPS), 2 * nbytes),
        ("rms_norm", "bwd dx", lambda: crms.rms_norm_dx(dy, x, w, rstd),
         torch_bwd(lambda: F.rms_norm(xg, (hidden,), wg, EPS), [xg, wg], dy), 3 * nbytes),
        ("rms_norm", "bwd dweight", dweight, None, 2 * nbytes),
        ("silu", "fwd", lambda: csilu.silu_forward(x), lambda: F.silu(x), 2 * nbytes),
        ("silu", "bwd", lambda: csilu.silu_backward(x, dy), torch_bwd(lambda: F.silu(xg), [xg], dy),
         3 * nbytes),
        ("swiglu", "fwd", lambda: cswiglu.swiglu_forward(x, u), lambda: F.silu(x) * u, 3 * nbytes),
        ("swiglu", "bwd", lambda: cswiglu.swiglu_backward(x, u, dy),
         torch_bwd(lambda: F.silu(xg) * ug, [xg, ug], dy), 5 * nbytes),
        ("rope", "fwd", lambda: crope.rope_apply(xr, pos, THETA, False), lambda: torch_rope(xr, pos, THETA),
         2 * nbytes),
        ("rope", "bwd", lambda: crope.rope_apply(dyr, pos, THETA, True),
         torch_bwd(lambda: torch_rope(xrg, pos, THETA), [xrg], dyr), 2 * nbytes),
    ]
    out = []
    for op, phase, ours, ref, moved in cases:
        ms = time_ms(ours, iters)
        t_ms = time_ms(ref, iters) if ref is not None else None
        gbps = moved / ms / 1e6
        out.append({"op": op, "phase": phase, "ms": ms, "gbps": gbps, "frac_copy": gbps / copy_gbps,
                    "torch_ms": t_ms, "speedup_vs_torch": (t_ms / ms) if t_ms else None})
    out.append({"op": "rms_norm", "phase": "host fold.take", "ms": take_ms, "gbps": None, "frac_copy": None,
                "torch_ms": None, "speedup_vs_torch": None})
    return copy_gbps, out


# ----------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_check_cuda.json", help="JSON report path")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="checks only, no timing")
    args = ap.parse_args(argv)

    ok, why = cuda_status()
    report: dict = {"cuda_status": [ok, why], "checks": [], "timings": [], "copy_gbps": None}
    print(f"cuda_status: {ok} {why}")
    if not ok or not torch.cuda.is_available():
        print(f"FAIL cuda_status: {why}")
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
        return 1
    from gradsweep.cuda_kernels import runtime

    report["build_info"] = runtime.load().build_info()
    report["device"] = torch.cuda.get_device_name()
    report["torch"] = torch.__version__
    n_fail = 0
    for name, fn in CHECKS.items():
        try:
            passed, detail = fn()
        except Exception as exc:  # a crashed check is a failure, the others still run
            passed, detail = False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        n_fail += not passed
        report["checks"].append({"name": name, "passed": passed, "detail": detail})
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail}")
        sys.stdout.flush()
    if not args.quick:
        try:
            copy_gbps, rows = timings(args.rows, args.hidden, args.iters)
            report["copy_gbps"] = copy_gbps
            report["timings"] = rows
            print(f"\ncopy ceiling ({args.rows} x {args.hidden} bf16): {copy_gbps:.0f} GB/s")
            print(f"{'op':10s} {'phase':16s} {'ms':>8s} {'GB/s':>7s} {'%copy':>6s} {'torch ms':>9s} "
                  f"{'x torch':>8s}")
            for r in rows:
                gb = f"{r['gbps']:.0f}" if r["gbps"] else "-"
                fr = f"{100 * r['frac_copy']:.0f}" if r["frac_copy"] else "-"
                tm = f"{r['torch_ms']:.4f}" if r["torch_ms"] else "-"
                sp = f"{r['speedup_vs_torch']:.2f}" if r["speedup_vs_torch"] else "-"
                print(f"{r['op']:10s} {r['phase']:16s} {r['ms']:8.4f} {gb:>7s} {fr:>6s} {tm:>9s} {sp:>8s}")
            for r in rows:
                if r["phase"] == "fwd":
                    good = r["frac_copy"] >= 0.8
                    print(f"{'PASS' if good else 'FAIL'} speed {r['op']} fwd: {100 * r['frac_copy']:.0f}% "
                          "of copy bandwidth (target >= 80%)")
        except Exception as exc:
            n_fail += 1
            report["timing_error"] = f"{type(exc).__name__}: {exc}"
            print(f"FAIL timing: {exc}\n{traceback.format_exc(limit=4)}")
    report["n_failed_checks"] = n_fail
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"\n{'PASS' if n_fail == 0 else 'FAIL'} overall: {n_fail} failed check(s); report in {args.out}")
    return 0 if n_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
