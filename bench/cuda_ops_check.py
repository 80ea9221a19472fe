"""GPU check of the CUDA family's ops of issue 10: correctness, bitwise invariance, speed. Run on a CUDA box.

    python3 bench/cuda_ops_check.py OUTDIR [--quick] [--only PREFIX] [--iters N]

Writes OUTDIR/cuda_ops_check.json (every check and timing) and OUTDIR/cuda_ops_check.txt (a short table);
exits 1 when any correctness or invariance check fails (a speed miss is reported, never fatal).

Ops: det_gemm, lm_head, linear_logp, logp, batch_invariant_logp, embedding, qk_norm, pack (gradsweep._C
through the same modules the sweep calls, gradsweep.cuda_kernels.<op>). For each:
- invariance, bitwise (raw bits, after logical restore): one packed call vs one call per sample (in order and
  reversed), irregular chunks cut on and off the 64-token canonical tile edges, right / left padding, permuted
  samples, shuffled rows, misaligned buffers; every forward first then the backwards in reverse call order,
  and interleaved forward/backward for chunked and single-sample calls. Pads hold NaN / +-inf values (and
  out-of-range ids / targets) with NaN upstream gradients: a pad that leaks changes bits or fails accuracy.
  The main grad starts NONZERO (a kernel that does not load it fails accuracy).
- row-wise M invariance: rows computed alone or in batches of other sizes (1 .. 1000: every tile
  configuration) give the same bits;
- accuracy against a float64 reference with a numerical-analysis bound (bf16 rounding 2^-8 and fp32 terms
  2^-24 times the operation count and the sum of absolute terms), no free tolerance.
Every buffer the CUDA modules allocate with torch.empty is filled with NaN first (``poisoned``), so an
element a kernel forgets to write shows up as a difference, never as a stale copy of a previous run.
Timing: each kernel vs its stock torch / cuBLAS equivalent and the copy bandwidth, measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import itertools
import json
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_cuda as base  # bench/ helpers: layouts, same_bits, within, time_ms

from gradsweep.canonical import CanonicalFold, RowIdentity

U16, U32, TINY = base.U16, base.U32, base.TINY
LENGTHS = list(base.LENGTHS)  # [5, 70, 1, 130, 64, 33]: crosses 64-token tiles, a 1-token sample, an exact tile
DEV = "cuda"  # a module variable so the plumbing can be dry-run on the CPU with a stand-in extension
EPS = 1e-6
OPS = ("batch_invariant_logp", "embedding", "gemm", "linear_logp", "lm_head", "logp", "pack", "qk_norm")
Result = tuple[bool, str]
Call = tuple[list[int], list[int]]


def kmod(name: str):
    return importlib.import_module(f"gradsweep.cuda_kernels.{name}")


# ----------------------------------------------------------------------------------------------- poisoning
class _PoisonTorch:
    """Stands in for ``torch`` inside the CUDA kernel modules: torch.empty / empty_like return NaN-filled
    (floats) or -7-filled (integers) tensors; everything else is torch itself."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def _fill(t: torch.Tensor) -> torch.Tensor:
        if t.numel():
            t.fill_(float("nan") if t.dtype.is_floating_point else -7)
        return t

    def empty(self, *args, **kwargs):
        return self._fill(self._real.empty(*args, **kwargs))

    def empty_like(self, *args, **kwargs):
        return self._fill(self._real.empty_like(*args, **kwargs))


@contextlib.contextmanager
def poisoned() -> Iterator[None]:
    mods = [kmod(n) for n in (*OPS, "rms_norm")]
    saved = [m.torch for m in mods]
    try:
        for m in mods:
            m.torch = _PoisonTorch(torch)
        yield
    finally:
        for m, t in zip(mods, saved):
            m.torch = t


# ----------------------------------------------------------------------------------------------- data
def gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def randn(shape: tuple[int, ...], seed: int, scale: float = 1.0, shift: float = 0.0,
          dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return (torch.randn(shape, generator=gen(seed)) * scale + shift).to(dtype).to(DEV)


def randint(high: int, n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, high, (n,), generator=gen(seed)).to(DEV)


def hostile(shape: tuple[int, ...], dtype: torch.dtype, seed: int, high: int | None = None) -> torch.Tensor:
    """What a trainer's pad rows hold: NaN, +inf, -inf, huge values; ids / targets out of range or valid."""
    n = math.prod(shape)
    if not dtype.is_floating_point:
        hi = high or 1
        pattern = torch.tensor([-100, hi + 3, -1, 0, hi - 1], dtype=dtype)
        return pattern.repeat(n // 5 + 1)[:n].reshape(shape).to(DEV)
    pattern = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.0e38, -1.0e30, float("nan")])
    start = seed % len(pattern)
    vals = pattern.roll(start).repeat(n // len(pattern) + 1)[:n]
    return vals.reshape(shape).to(dtype).to(DEV)


def offsets(lengths: list[int]) -> list[int]:
    return base.offsets(lengths)


def layouts(lengths: list[int]) -> dict[str, list[Call]]:
    """bench/gpu_check_cuda.py's layouts plus chunks cut exactly on canonical 64-token tile edges."""
    lay = base.layouts(lengths)
    packed_s = [s for s in range(len(lengths)) for _ in range(lengths[s])]
    packed_p = [p for s in range(len(lengths)) for p in range(lengths[s])]
    offs = offsets(lengths)
    edges = sorted({o + 64 * j for s, o in enumerate(offs) for j in range(1, (lengths[s] + 63) // 64)}
                   | set(offs[1:]))
    cuts = [0, *[e for e in edges if 0 < e < len(packed_s)], len(packed_s)]
    lay["bn_chunked_tile_edges"] = [(packed_s[a:b], packed_p[a:b]) for a, b in itertools.pairwise(cuts) if b > a]
    return lay


def place(table: torch.Tensor, call: Call, offs: list[int], seed: int, misalign: bool = False,
          high: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Physical tensor of a call from a logical table (pads hostile), its real-row mask, the logical index."""
    real = torch.tensor(call[0], dtype=torch.int64) >= 0
    logical = torch.tensor([offs[a] + b for a, b in zip(call[0], call[1]) if a >= 0], dtype=torch.int64)
    shape = (len(call[0]), *table.shape[1:])
    if misalign and table.dtype == torch.bfloat16:  # storage one element off 16-byte alignment
        flat = torch.empty(math.prod(shape) + 1, dtype=table.dtype, device=DEV)
        phys = flat[1:].view(shape)
    else:
        phys = torch.empty(shape, dtype=table.dtype, device=DEV)
    phys.copy_(hostile(shape, table.dtype, seed, high))
    real_d = real.to(DEV)
    if logical.numel():
        phys[real_d] = table[logical.to(DEV)]
    return phys, real_d, logical.to(DEV)


def rows_of(call: Call) -> RowIdentity:
    return RowIdentity(torch.tensor(call[0], dtype=torch.int64), torch.tensor(call[1], dtype=torch.int64))


def slots(lengths: list[int], tile: int) -> int:
    """Canonical slots a fold walks (zero rows of each sample's last tile included)."""
    return sum(-(-n // tile) * tile for n in lengths)


# ----------------------------------------------------------------------------------------------- row-op runner
@dataclass
class RowCase:
    """One op on logical token tables: inputs [T, ...], parameters, an upstream gradient table, a fold."""

    fn: Callable[[dict[str, torch.Tensor], RowIdentity, CanonicalFold | None], torch.Tensor]
    inputs: dict[str, torch.Tensor]
    dy: torch.Tensor
    grad_inputs: tuple[str, ...] = ()
    mg0: torch.Tensor | None = None
    tile: int = 64
    index_high: dict[str, int] = field(default_factory=dict)


def run_case(case: RowCase, calls: list[Call], schedule: str = "reverse",
             misalign: bool = False) -> dict[str, torch.Tensor]:
    """Outputs and gradients in logical order (and the final main grad) for one layout and schedule."""
    offs = offsets(LENGTHS)
    fold = CanonicalFold(case.mg0.clone(), LENGTHS, case.tile) if case.mg0 is not None else None
    done: list[tuple] = []
    pending: list[tuple] = []
    for k, call in enumerate(calls):
        phys, real, logical = {}, None, None
        for i, (name, table) in enumerate(case.inputs.items()):
            p, real, logical = place(table, call, offs, 1000 * k + 7 * i, misalign, case.index_high.get(name))
            if name in case.grad_inputs:
                p.requires_grad_(True)
            phys[name] = p
        dy, _, _ = place(case.dy, call, offs, 5000 + k, misalign)
        out = case.fn(phys, rows_of(call), fold)
        entry = (out, phys, dy, real, logical)
        if schedule == "interleaved":
            out.backward(dy)
            done.append(entry)
        else:
            pending.append(entry)
    for entry in reversed(pending):
        entry[0].backward(entry[2])
    done += pending
    result: dict[str, torch.Tensor] = {}
    for out, phys, _, real, logical in done:
        if "out" not in result:
            result["out"] = torch.full((sum(LENGTHS), *out.shape[1:]), float("nan"), dtype=out.dtype, device=DEV)
            for name in case.grad_inputs:
                result["d" + name] = torch.full_like(case.inputs[name], float("nan"))
        result["out"][logical] = out.detach()[real]
        for name in case.grad_inputs:
            result["d" + name][logical] = phys[name].grad[real]
    if fold is not None:
        result["main_grad"] = fold.finish()
    return result


def invariance(case: RowCase) -> Result:
    lay = layouts(LENGTHS)
    with poisoned():
        ref = run_case(case, lay["bn_full"])
        runs: dict[str, tuple[list[Call], str, bool]] = {n: (c, "reverse", False) for n, c in lay.items()
                                                        if n != "bn_full"}
        for n in ("bn_chunked", "bn_chunked_tile_edges", "b1_singleton"):
            runs[n + "/interleaved"] = (lay[n], "interleaved", False)
        runs["bn_full/misaligned"] = (lay["bn_full"], "reverse", True)
        runs["bn_chunked/misaligned"] = (lay["bn_chunked"], "reverse", True)
        msgs = []
        for name, (calls, sched, mis) in runs.items():
            got = run_case(case, calls, sched, mis)
            for tname, a in ref.items():
                ok, msg = base.same_bits(a, got[tname])
                if not ok:
                    msgs.append(f"{name}/{tname}: {msg}")
    nan_ref = [t for t, a in ref.items() if a.is_floating_point() and bool(torch.isnan(a).any())]
    if nan_ref:
        msgs.append(f"bn_full itself has NaN in {nan_ref} (a pad leaked or an element was never written)")
    if msgs:
        return False, "; ".join(msgs[:8]) + (f" (+{len(msgs) - 8} more)" if len(msgs) > 8 else "")
    return True, f"{len(runs)} layouts/schedules bitwise equal to bn_full ({', '.join(ref)})"


def accuracy(case: RowCase, reference: Callable[[dict[str, torch.Tensor]], list[Result]]) -> Result:
    with poisoned():
        got = run_case(case, layouts(LENGTHS)["bn_full"])
    res = reference(got)
    return all(ok for ok, _ in res), "; ".join(m for _, m in res)


# ----------------------------------------------------------------------------------------------- GEMM family
def gemm_case(op: str, k: int, n: int, seed: int = 100) -> tuple[RowCase, torch.Tensor]:
    T = sum(LENGTHS)
    mod = kmod(op)
    fn_name = "det_linear" if op == "gemm" else "lm_head"
    W = randn((n, k), seed + 1, scale=k ** -0.5)
    Wg = W.detach().requires_grad_(True)  # dW goes to the fold, never to Wg.grad
    case = RowCase(fn=lambda p, rows, fold: getattr(mod, fn_name)(p["x"], Wg, rows, fold),
                   inputs={"x": randn((T, k), seed)}, dy=randn((T, n), seed + 2), grad_inputs=("x",),
                   mg0=torch.randn((n, k), generator=gen(seed + 3)).to(DEV), tile=mod.TILE)
    return case, W


def gemm_reference(case: RowCase, W: torch.Tensor) -> Callable[[dict], list[Result]]:
    def ref(got: dict) -> list[Result]:
        x, w, g, mg0 = case.inputs["x"].double(), W.double(), case.dy.double(), case.mg0.double()
        k, t_slots = x.shape[1], slots(LENGTHS, case.tile)
        y = x @ w.T
        dx = g @ w
        dw = mg0 + g.T @ x
        # bf16 output rounding + an fp32 accumulation of K (resp. N, slot) terms: 2 (n + 16) 2^-24 sum|terms|
        b_y = U16 * y.abs() * 1.01 + 2 * (k + 16) * U32 * (x.abs() @ w.abs().T) + TINY
        b_dx = U16 * dx.abs() * 1.01 + 2 * (w.shape[0] + 16) * U32 * (g.abs() @ w.abs()) + TINY
        b_dw = 2 * (t_slots + 16) * U32 * (mg0.abs() + g.abs().T @ x.abs()) + TINY
        return [base.within("y", got["out"], y, b_y), base.within("dX", got["dx"], dx, b_dx),
                base.within("dW", got["main_grad"], dw, b_dw)]
    return ref


def check_gemm_rows(op: str, k: int, n: int) -> Result:
    """Forward and dX of a row do not depend on M or on the row's position (every tile configuration)."""
    mod = kmod("gemm")
    m_all = 1000
    x = randn((m_all, k), 201)
    W = randn((n, k), 202, scale=k ** -0.5)
    dy = randn((m_all, n), 203)
    msgs = []
    with poisoned():
        y_all = mod.matmul_invariant(x, W)
        dx_all = mod.matmul_invariant(dy, W.t())
        for lo, hi in ((0, 1), (5, 7), (0, 15), (3, 19), (100, 117), (1, 256), (0, 257), (400, 1000), (999, 1000)):
            y = mod.matmul_invariant(x[lo:hi].contiguous(), W)
            dx = mod.matmul_invariant(dy[lo:hi].contiguous(), W.t())
            for tname, a, b in (("y", y, y_all[lo:hi]), ("dX", dx, dx_all[lo:hi])):
                ok, msg = base.same_bits(a, b)
                if not ok:
                    msgs.append(f"rows {lo}:{hi} {tname}: {msg}")
        nan = bool(torch.isnan(y_all).any()) or bool(torch.isnan(dx_all).any())
    if nan:
        msgs.append("NaN in the M=1000 outputs (an element was never written)")
    return not msgs, "; ".join(msgs) if msgs else f"{op} K={k} N={n}: M in 1..1000 at 9 offsets bitwise equal"


def check_gemm_accumulate() -> Result:
    """matmul_accumulate loads its fp32 accumulator (a chain of two calls == the math of one, within bounds)."""
    mod = kmod("gemm")
    a1, a2 = randn((37, 300), 211), randn((37, 200), 212)
    b1, b2 = randn((300, 72), 213), randn((200, 72), 214)
    acc0 = torch.randn((37, 72), generator=gen(215)).to(DEV)
    with poisoned():
        acc = acc0.clone()
        mod.matmul_accumulate(a1, b1, acc)
        mod.matmul_accumulate(a2, b2, acc)
    ref = acc0.double() + a1.double() @ b1.double() + a2.double() @ b2.double()
    terms = acc0.double().abs() + a1.double().abs() @ b1.double().abs() + a2.double().abs() @ b2.double().abs()
    return base.within("acc", acc, ref, 2 * (500 + 32) * U32 * terms + TINY)


# ----------------------------------------------------------------------------------------------- logp family
def logp_case(vocab: int, seed: int = 300) -> RowCase:
    T = sum(LENGTHS)
    mod = kmod("logp")
    return RowCase(fn=lambda p, rows, fold: mod.selected_logp(p["logits"], p["targets"]),
                   inputs={"logits": randn((T, vocab), seed, scale=2.0), "targets": randint(vocab, T, seed + 1)},
                   dy=randn((T,), seed + 2, dtype=torch.float32), grad_inputs=("logits",),
                   index_high={"targets": vocab})


def softmax_bounds(z: torch.Tensor, t: torch.Tensor, g: torch.Tensor, zerr: torch.Tensor, vocab: int):
    """(logp, dlogits, p, delta): fp64 reference from logits z and the relative error bound delta of p.

    zerr[r] bounds the error of every logit of row r; the fp32 log-sum-exp adds (V + 64) 2^-24 (sequential
    sum of V terms, worst case) and 4 2^-24 |lse| (exp / log rounding).
    """
    lse = torch.logsumexp(z, 1)
    p = torch.exp(z - lse[:, None])
    logp = z.gather(1, t[:, None])[:, 0] - lse
    onehot = torch.nn.functional.one_hot(t, vocab).double()
    d = g[:, None] * (onehot - p)
    fp = (vocab + 64) * U32 + 4 * U32 * lse.abs()
    delta = 2 * zerr + fp  # relative error of p = exp(z - lse)
    b_logp = 2 * zerr + fp + 4 * U32 * (z.gather(1, t[:, None])[:, 0].abs() + lse.abs()) + TINY
    return logp, d, p, delta, b_logp


def logp_reference(case: RowCase, vocab: int) -> Callable[[dict], list[Result]]:
    def ref(got: dict) -> list[Result]:
        z, t, g = case.inputs["logits"].double(), case.inputs["targets"], case.dy.double()
        logp, d, p, delta, b_logp = softmax_bounds(z, t, g, torch.zeros_like(g), vocab)
        b_d = U16 * d.abs() * 1.01 + g.abs()[:, None] * p * delta[:, None] * 1.01 + TINY
        return [base.within("logp", got["out"], logp, b_logp), base.within("dlogits", got["dlogits"], d, b_d)]
    return ref


def llp_case(op: str, k: int, vocab: int, seed: int = 400) -> tuple[RowCase, torch.Tensor]:
    T = sum(LENGTHS)
    mod = kmod(op)
    fn = mod.linear_logp if op == "linear_logp" else mod.batch_invariant_logp
    W = randn((vocab, k), seed + 1, scale=k ** -0.5)
    Wg = W.detach().requires_grad_(True)  # dW goes to the fold, never to Wg.grad
    case = RowCase(fn=lambda p, rows, fold: fn(p["hidden"], Wg, p["targets"], rows, fold),
                   inputs={"hidden": randn((T, k), seed), "targets": randint(vocab, T, seed + 2)},
                   dy=randn((T,), seed + 3, dtype=torch.float32), grad_inputs=("hidden",),
                   mg0=torch.randn((vocab, k), generator=gen(seed + 4)).to(DEV), tile=mod.TILE,
                   index_high={"targets": vocab})
    return case, W


def llp_reference(case: RowCase, W: torch.Tensor, bf16_logits: bool) -> Callable[[dict], list[Result]]:
    def ref(got: dict) -> list[Result]:
        h, w, t, g, mg0 = (case.inputs["hidden"].double(), W.double(), case.inputs["targets"], case.dy.double(),
                           case.mg0.double())
        k, vocab = h.shape[1], w.shape[0]
        z = h @ w.T
        absz = h.abs() @ w.abs().T
        zerr = 2 * (k + 16) * U32 * absz.max(1).values  # fp32 tensor-core logits
        if bf16_logits:  # the unfused chain rounds logits to bf16 before the logp kernel
            zerr = zerr + U16 * z.abs().max(1).values * 1.01
        logp, d, p, delta, b_logp = softmax_bounds(z, t, g, zerr, vocab)
        dd = U16 * d.abs() + g.abs()[:, None] * p * delta[:, None]  # error of the bf16 dlogits used next
        dh = d @ w
        dw = mg0 + d.T @ h
        b_dh = U16 * dh.abs() * 1.01 + (dd @ w.abs() + 2 * (vocab + 16) * U32 * (d.abs() @ w.abs())) * 1.01 + TINY
        t_slots = slots(LENGTHS, case.tile)
        b_dw = (dd.T @ h.abs() + 2 * (t_slots + 16) * U32 * (mg0.abs() + d.abs().T @ h.abs())) * 1.01 + TINY
        return [base.within("logp", got["out"], logp, b_logp), base.within("dhidden", got["dhidden"], dh, b_dh),
                base.within("dW", got["main_grad"], dw, b_dw)]
    return ref


def check_llp_rows(k: int, vocab: int) -> Result:
    """Fused forward and dlogits of a row do not depend on R or on the row's position."""
    mod = kmod("linear_logp")
    R = 300
    h = randn((R, k), 501)
    W = randn((vocab, k), 502, scale=k ** -0.5)
    t = randint(vocab, R, 503)
    g = randn((R,), 504, dtype=torch.float32)
    msgs = []
    with poisoned():
        out_all, lse_all = mod.fused_forward(h, W, t)
        d_all = mod.dlogits_chunk(h, W, t, lse_all, g, 0, vocab)
        for lo, hi in ((0, 1), (7, 8), (0, 17), (5, 133), (128, 300), (299, 300)):
            out, lse = mod.fused_forward(h[lo:hi].contiguous(), W, t[lo:hi].contiguous())
            d = mod.dlogits_chunk(h[lo:hi].contiguous(), W, t[lo:hi].contiguous(), lse, g[lo:hi].contiguous(), 0,
                                  vocab)
            for tname, a, b in (("logp", out, out_all[lo:hi]), ("lse", lse, lse_all[lo:hi]),
                                ("dlogits", d, d_all[lo:hi])):
                ok, msg = base.same_bits(a, b)
                if not ok:
                    msgs.append(f"rows {lo}:{hi} {tname}: {msg}")
    if bool(torch.isnan(out_all).any()) or bool(torch.isnan(d_all).any()):
        msgs.append("NaN in the R=300 outputs")
    return not msgs, "; ".join(msgs) if msgs else f"K={k} V={vocab}: R in 1..300 at 6 offsets bitwise equal"


def check_llp_bwd_chunk(k: int, vocab: int) -> Result:
    """The backward's vocabulary chunk is a speed knob: BWD_VCHUNK 8192 and 1024 give the same bits."""
    mod = kmod("linear_logp")
    case, _ = llp_case("linear_logp", k, vocab, seed=450)
    calls = layouts(LENGTHS)["bn_chunked"]
    with poisoned():
        ref = run_case(case, calls)
        saved = mod.BWD_VCHUNK
        try:
            mod.BWD_VCHUNK = 1024
            got = run_case(case, calls)
        finally:
            mod.BWD_VCHUNK = saved
    msgs = [f"{n}: {m}" for n in ref for ok, m in [base.same_bits(ref[n], got[n])] if not ok]
    return not msgs, "; ".join(msgs) if msgs else "BWD_VCHUNK 1024 == 8192 bitwise (logp, dhidden, dW)"


# ----------------------------------------------------------------------------------------------- embedding
def emb_case(vocab: int, hidden: int, seed: int = 600) -> tuple[RowCase, torch.Tensor]:
    T = sum(LENGTHS)
    mod = kmod("embedding")
    W = randn((vocab, hidden), seed + 1)
    case = RowCase(fn=lambda p, rows, fold: mod.embedding(p["ids"], W.detach().requires_grad_(True), rows, fold),
                   inputs={"ids": randint(vocab, T, seed)}, dy=randn((T, hidden), seed + 2),
                   mg0=torch.randn((vocab, hidden), generator=gen(seed + 3)).to(DEV), tile=mod.TILE,
                   index_high={"ids": vocab})
    return case, W


def emb_reference(case: RowCase, W: torch.Tensor) -> Callable[[dict], list[Result]]:
    def ref(got: dict) -> list[Result]:
        ids, g, mg0 = case.inputs["ids"], case.dy.double(), case.mg0.double()
        y = W[ids]
        ok_y, msg_y = base.same_bits(got["out"], y)
        dw = mg0.index_add(0, ids, g)
        absw = mg0.abs().index_add(0, ids, g.abs())
        count = torch.bincount(ids, minlength=W.shape[0]).double()[:, None]
        b_dw = 2 * (count + 16) * U32 * absw + TINY
        return [(ok_y, f"y: {msg_y} (a gather is a bit copy)"), base.within("dweight", got["main_grad"], dw, b_dw)]
    return ref


# ----------------------------------------------------------------------------------------------- qk_norm
def qk_case(heads: int, head_dim: int, seed: int = 700) -> tuple[RowCase, torch.Tensor]:
    T = sum(LENGTHS)
    mod = kmod("qk_norm")
    W = randn((head_dim,), seed + 1, scale=0.3, shift=1.0)
    case = RowCase(fn=lambda p, rows, fold: mod.qk_norm(p["x"], W.detach().requires_grad_(True), EPS, rows, fold),
                   inputs={"x": randn((T, heads, head_dim), seed)}, dy=randn((T, heads, head_dim), seed + 2),
                   grad_inputs=("x",), mg0=torch.randn(head_dim, generator=gen(seed + 3)).to(DEV), tile=mod.TILE)
    return case, W


def qk_reference(case: RowCase, W: torch.Tensor) -> Callable[[dict], list[Result]]:
    def ref(got: dict) -> list[Result]:
        x, w, g, mg0 = case.inputs["x"].double(), W.double(), case.dy.double(), case.mg0.double()
        d = x.shape[-1]
        r = torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)
        y = x * r * w
        gw = g * w
        c = (gw * x).sum(-1, keepdim=True)
        dx = r * gw - x * r**3 * c / d
        contrib = (g * x * r).sum(1)
        dw = mg0 + contrib.sum(0)
        n_terms = slots(LENGTHS, case.tile) * x.shape[1]
        b_y = (U16 + (d + 8) * U32) * y.abs() * 1.01 + TINY
        a_dx = r * (gw.abs() + x.abs() * r**2 * (gw * x).abs().sum(-1, keepdim=True) / d)
        b_dx = U16 * dx.abs() * 1.01 + (2 * d + 16) * U32 * a_dx + TINY
        b_dw = (n_terms + d + 16) * U32 * (mg0.abs() + (g * x * r).abs().sum((0, 1))) + TINY
        return [base.within("y", got["out"], y, b_y), base.within("dx", got["dx"], dx, b_dx),
                base.within("dweight", got["main_grad"], dw, b_dw)]
    return ref


# ----------------------------------------------------------------------------------------------- pack
def check_pack(hidden: int) -> Result:
    """pack of padded batches (pads hostile) == the logical rows; its backward unpacks dy with zero pads."""
    mod = kmod("pack")
    T = sum(LENGTHS)
    offs = offsets(LENGTHS)
    X = randn((T, hidden), 801)
    DY = randn((T, hidden), 802)
    groups = {"all": list(range(len(LENGTHS))), "permuted": [3, 0, 5, 1, 4, 2], "pair": [2, 4]}
    groups |= {f"single{s}": [s] for s in range(len(LENGTHS))}
    msgs = []
    with poisoned():
        for name, samples in groups.items():
            lens = [LENGTHS[s] for s in samples]
            width = max(lens) + 3
            for misalign, left in ((False, False), (True, False), (False, True), (True, True)):
                starts = [width - n if left else 0 for n in lens]
                flat = torch.empty(len(samples) * width * hidden + 1, dtype=torch.bfloat16, device=DEV)
                x = flat[int(misalign):int(misalign) + len(samples) * width * hidden].view(len(samples), width, hidden)
                x.copy_(hostile(tuple(x.shape), torch.bfloat16, 3))
                for b, s in enumerate(samples):
                    x[b, starts[b]:starts[b] + LENGTHS[s]] = X[offs[s]:offs[s] + LENGTHS[s]]
                x.requires_grad_(True)
                packed = mod.pack(x, torch.tensor(lens), torch.tensor(starts))
                want = torch.cat([X[offs[s]:offs[s] + LENGTHS[s]] for s in samples])
                dy = torch.cat([DY[offs[s]:offs[s] + LENGTHS[s]] for s in samples])
                packed.backward(dy)
                want_dx = torch.zeros((len(samples), width, hidden), dtype=torch.bfloat16, device=DEV)
                for b, s in enumerate(samples):
                    want_dx[b, starts[b]:starts[b] + LENGTHS[s]] = DY[offs[s]:offs[s] + LENGTHS[s]]
                for tname, a, b in (("packed", packed, want), ("dx", x.grad, want_dx)):
                    ok, msg = base.same_bits(a.detach(), b)
                    if not ok:
                        tag = f"{'/misaligned' if misalign else ''}{'/left' if left else ''}"
                        msgs.append(f"{name}{tag}/{tname}: {msg}")
        packed = randn((T, hidden), 803)
        un = mod.unpack(packed, torch.tensor(LENGTHS), max(LENGTHS))
        back = mod.pack(un, torch.tensor(LENGTHS))
        ok, msg = base.same_bits(back, packed)
        if not ok:
            msgs.append(f"unpack->pack round trip: {msg}")
        pad = torch.arange(max(LENGTHS), device=DEV)[None, :] >= torch.tensor(LENGTHS, device=DEV)[:, None]
        if bool((un[pad] != 0).any()):
            msgs.append("unpack pads are not zero")
    summary = f"{len(groups)} batches x 2 alignments x right/left padding: bit copies, zero pads"
    return not msgs, "; ".join(msgs) if msgs else summary


# ----------------------------------------------------------------------------------------------- checks
def _row_checks(prefix: str, make: Callable[[], tuple[RowCase, Callable[[dict], list[Result]]]]) -> dict:
    return {f"{prefix}/invariance": lambda: invariance(make()[0]),
            f"{prefix}/accuracy": lambda: accuracy(*make())}


def _gemm(op: str, k: int, n: int):
    def make():
        case, W = gemm_case(op, k, n)
        return case, gemm_reference(case, W)
    return make


def _llp(op: str, k: int, v: int):
    def make():
        case, W = llp_case(op, k, v)
        return case, llp_reference(case, W, bf16_logits=op == "batch_invariant_logp")
    return make


def _logp(v: int):
    def make():
        case = logp_case(v)
        return case, logp_reference(case, v)
    return make


def _emb(v: int, h: int):
    def make():
        case, W = emb_case(v, h)
        return case, emb_reference(case, W)
    return make


def _qk(heads: int, d: int):
    def make():
        case, W = qk_case(heads, d)
        return case, qk_reference(case, W)
    return make


CHECKS: dict[str, Callable[[], Result]] = {
    **_row_checks("det_gemm/K512N256", _gemm("gemm", 512, 256)),
    **_row_checks("det_gemm/K48N80", _gemm("gemm", 48, 80)),
    **_row_checks("det_gemm/K100N36", _gemm("gemm", 100, 36)),  # K % 8 != 0: element loads, K tail
    "det_gemm/rows/K4096N512": lambda: check_gemm_rows("gemm", 4096, 512),
    "det_gemm/rows/K100N300": lambda: check_gemm_rows("gemm", 100, 300),
    "det_gemm/accumulate": check_gemm_accumulate,
    **_row_checks("lm_head/K256V1000", _gemm("lm_head", 256, 1000)),
    **_row_checks("lm_head/K48V300", _gemm("lm_head", 48, 300)),
    **_row_checks("logp/V1000", _logp(1000)),
    **_row_checks("logp/V300", _logp(300)),  # rows not 16-byte aligned: element loads
    **_row_checks("logp/V4099", _logp(4099)),
    **_row_checks("batch_invariant_logp/K256V1000", _llp("batch_invariant_logp", 256, 1000)),
    **_row_checks("batch_invariant_logp/K48V300", _llp("batch_invariant_logp", 48, 300)),
    **_row_checks("linear_logp/K256V3000", _llp("linear_logp", 256, 3000)),  # crosses a 2048-column chunk
    **_row_checks("linear_logp/K48V300", _llp("linear_logp", 48, 300)),
    "linear_logp/rows/K256V3000": lambda: check_llp_rows(256, 3000),
    "linear_logp/bwd_chunk/K64V3000": lambda: check_llp_bwd_chunk(64, 3000),
    **_row_checks("embedding/V50H96", _emb(50, 96)),
    **_row_checks("embedding/V1000H100", _emb(1000, 100)),
    **_row_checks("qk_norm/h3d32", _qk(3, 32)),
    **_row_checks("qk_norm/h8d128", _qk(8, 128)),
    **_row_checks("qk_norm/h2d10", _qk(2, 10)),
    "pack/H32": lambda: check_pack(32),
    "pack/H100": lambda: check_pack(100),
}


# ----------------------------------------------------------------------------------------------- timing
# Predicted milliseconds on the H200 (notes/kernels_cuda.md derives them), so the run can be compared.
# logp and linear_logp rows are timed at T=4096, or T=16384 with --big (second value).
PREDICTED_MS: dict[str, float | tuple[float, float]] = {
    "gemm fwd M1": 0.015, "gemm fwd M16": 0.015, "gemm fwd M256": 0.045, "gemm fwd M4096": 0.40,
    "gemm fwd M16384": 1.6, "gemm fwd M16 N14336": 0.035, "gemm fwd M16 N151936": 0.33,
    "gemm dX M1": 0.015, "gemm dX M16": 0.015, "gemm dX M256": 0.045, "gemm dX M4096": 0.40, "gemm dX M16384": 1.6,
    "gemm dW T4096": 0.45, "gemm dW T16384": 1.7,
    "logp fwd": (0.35, 1.4), "logp bwd": (0.7, 2.7), "linear_logp fwd": (17.0, 68.0),
    "linear_logp fwd+bwd": (65.0, 260.0), "embedding fwd": 0.075, "embedding bwd": 0.3, "qk_norm fwd": 0.12,
    "qk_norm bwd": 0.55, "pack fwd": 0.06, "pack bwd": 0.07,
}


def predicted(name: str, big: bool) -> float | None:
    p = PREDICTED_MS.get(name)
    return p[int(big)] if isinstance(p, tuple) else p


def timings(iters: int, big: bool) -> tuple[float, list[dict]]:
    """(copy GB/s, rows). Each row: ours vs the stock equivalent, in the same run."""
    F = torch.nn.functional
    gemm, logp, llp, emb, qk, pack = (kmod(n) for n in ("gemm", "logp", "linear_logp", "embedding", "qk_norm",
                                                        "pack"))
    src = torch.randn(1 << 28, device=DEV, dtype=torch.bfloat16)  # 512 MiB
    dst = torch.empty_like(src)
    copy_ms = base.time_ms(lambda: dst.copy_(src), iters)
    copy_gbps = 2 * src.numel() * 2 / copy_ms / 1e6
    rows: list[dict] = []

    def add(name: str, ours: Callable[[], object], stock: Callable[[], object] | None, flops: float = 0.0,
            nbytes: float = 0.0, n: int = iters) -> None:
        ms = base.time_ms(ours, n)
        st = base.time_ms(stock, n) if stock is not None else None
        rows.append({"kernel": name, "ms": ms, "stock_ms": st, "ratio_vs_stock": ms / st if st else None,
                     "tflops": flops / ms / 1e9 if flops else None, "gbps": nbytes / ms / 1e6 if nbytes else None,
                     "frac_copy": nbytes / ms / 1e6 / copy_gbps if nbytes else None,
                     "predicted_ms": predicted(name, big)})
        print(f"  {name:24s} {ms:9.4f} ms  stock {st if st is None else round(st, 4)}", flush=True)

    K = N = 4096
    W = torch.randn(N, K, device=DEV).to(torch.bfloat16) * 0.02
    for m in (1, 16, 256, 4096, 16384):
        x = torch.randn(m, K, device=DEV).to(torch.bfloat16)
        dy = torch.randn(m, N, device=DEV).to(torch.bfloat16)
        add(f"gemm fwd M{m}", lambda x=x: gemm.matmul_invariant(x, W), lambda x=x: torch.mm(x, W.t()),
            flops=2.0 * m * N * K, nbytes=2.0 * (m * K + N * K + m * N))
        add(f"gemm dX M{m}", lambda dy=dy: gemm.matmul_invariant(dy, W.t()), lambda dy=dy: torch.mm(dy, W),
            flops=2.0 * m * N * K, nbytes=2.0 * (m * K + N * K + m * N))
    for n_big in (14336, 151936):
        Wb = torch.randn(n_big, K, device=DEV).to(torch.bfloat16) * 0.02
        x = torch.randn(16, K, device=DEV).to(torch.bfloat16)
        add(f"gemm fwd M16 N{n_big}", lambda x=x, Wb=Wb: gemm.matmul_invariant(x, Wb),
            lambda x=x, Wb=Wb: torch.mm(x, Wb.t()), flops=2.0 * 16 * n_big * K, nbytes=2.0 * n_big * K)
        del Wb
    for t in (4096, 16384):
        x = torch.randn(t, K, device=DEV).to(torch.bfloat16)
        dy = torch.randn(t, N, device=DEV).to(torch.bfloat16)
        plan = torch.arange(t, dtype=torch.int32, device=DEV).view(-1, gemm.TILE)
        mg = torch.zeros(N, K, device=DEV)
        add(f"gemm dW T{t}", lambda x=x, dy=dy, plan=plan, mg=mg: gemm.dw_fold_raw(plan, x, dy, mg),
            lambda x=x, dy=dy: torch.mm(dy.t(), x), flops=2.0 * t * N * K)
    torch.cuda.empty_cache()

    T, V = (16384, 151936) if big else (4096, 151936)
    logits = torch.randn(T, V, device=DEV).to(torch.bfloat16)
    tg = torch.randint(0, V, (T,), device=DEV)
    g = torch.randn(T, device=DEV)
    _, lse = logp.logp_forward(logits, tg)
    add("logp fwd", lambda: logp.logp_forward(logits, tg),
        lambda: torch.log_softmax(logits.float(), -1).gather(-1, tg[:, None]), nbytes=2.0 * T * V)
    lg = logits.float().requires_grad_(True)
    ref_out = torch.log_softmax(lg, -1).gather(-1, tg[:, None])[:, 0]
    add("logp bwd", lambda: logp.logp_backward(logits, tg, lse, g),
        lambda: torch.autograd.grad(ref_out, lg, g, retain_graph=True), nbytes=4.0 * T * V)
    torch.cuda.empty_cache()

    Tl = 16384 if big else 4096
    h = torch.randn(Tl, K, device=DEV).to(torch.bfloat16)
    Wv = (torch.randn(V, K, device=DEV) * 0.02).to(torch.bfloat16)
    tl = torch.randint(0, V, (Tl,), device=DEV)
    gl = torch.randn(Tl, device=DEV)
    mg_l = torch.zeros(V, K, device=DEV)  # the trainer's main grad: not counted as extra memory
    n_llp = max(3, iters // 5)
    add("linear_logp fwd", lambda: llp.fused_forward(h, Wv, tl), lambda: torch.mm(h, Wv.t()),
        flops=2.0 * Tl * V * K, n=n_llp)

    def llp_fwd_bwd() -> None:
        fold = CanonicalFold(mg_l, [Tl], llp.TILE)
        hh = h.detach().requires_grad_(True)
        o = llp.linear_logp(hh, Wv.detach().requires_grad_(True), tl, RowIdentity.packed([Tl]), fold)
        o.backward(gl)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_mem = torch.cuda.memory_allocated()
    llp_fwd_bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base_mem) / 2**30
    add("linear_logp fwd+bwd", llp_fwd_bwd, lambda: torch.mm(h, Wv.t()), flops=8.0 * Tl * V * K, n=n_llp)
    rows[-1]["peak_extra_gib"] = peak
    rows[-1]["T"] = Tl
    torch.cuda.empty_cache()

    Te, Ve, He = 16384, 151936, 4096
    We = torch.randn(Ve, He, device=DEV).to(torch.bfloat16)
    ids = torch.randint(0, Ve, (Te,), device=DEV)
    dye = torch.randn(Te, He, device=DEV).to(torch.bfloat16)
    mge = torch.zeros(Ve, He, device=DEV)
    add("embedding fwd", lambda: emb.embedding_forward(ids, We), lambda: F.embedding(ids, We),
        nbytes=4.0 * Te * He)
    tokens = torch.arange(Te, device=DEV)
    Weg = We.detach().requires_grad_(True)
    ref_e = F.embedding(ids, Weg)
    add("embedding bwd", lambda: emb.embedding_fold(tokens, ids, dye, mge),
        lambda: torch.autograd.grad(ref_e, Weg, dye, retain_graph=True), nbytes=2.0 * Te * He + 8.0 * Te * He)
    torch.cuda.empty_cache()

    heads, hd = 32, 128
    xq = torch.randn(Te, heads, hd, device=DEV).to(torch.bfloat16)
    wq = torch.ones(hd, device=DEV, dtype=torch.bfloat16)
    dq = torch.randn_like(xq)
    add("qk_norm fwd", lambda: qk.qk_norm_forward(xq, wq, EPS), lambda: F.rms_norm(xq, (hd,), wq, EPS),
        nbytes=4.0 * xq.numel())
    mg_q = torch.zeros(hd, device=DEV)
    rows_q = RowIdentity.packed([Te])

    def qk_bwd() -> None:  # a fresh fold per timed run (host plan included, as in training)
        qk.qk_norm_backward(xq, wq, dq, EPS, rows_q, CanonicalFold(mg_q, [Te], qk.TILE))
    xqg = xq.detach().requires_grad_(True)
    wqg = wq.detach().requires_grad_(True)
    ref_q = F.rms_norm(xqg, (hd,), wqg, EPS)
    add("qk_norm bwd", qk_bwd, lambda: torch.autograd.grad(ref_q, [xqg, wqg], dq, retain_graph=True),
        nbytes=6.0 * xq.numel())
    torch.cuda.empty_cache()

    B, L, H = 16, 1024, 4096
    xp = torch.randn(B, L, H, device=DEV).to(torch.bfloat16)
    lens = [L - 37 * i for i in range(B)]
    keep = torch.arange(L, device=DEV)[None, :] < torch.tensor(lens, device=DEV)[:, None]
    packed = pack.pack_forward(xp, lens)
    add("pack fwd", lambda: pack.pack_forward(xp, lens), lambda: xp[keep], nbytes=4.0 * sum(lens) * H)
    add("pack bwd", lambda: pack.unpack_forward(packed, lens, L), None, nbytes=2.0 * (sum(lens) + B * L) * H)
    return copy_gbps, rows


# ----------------------------------------------------------------------------------------------- main
def table(report: dict) -> str:
    lines = [f"cuda_ops_check: {report['device']} | {report['n_failed']} failed of {len(report['checks'])} checks",
             ""]
    for c in report["checks"]:
        lines.append(f"{'PASS' if c['passed'] else 'FAIL'} {c['name']}: {c['detail'][:300]}")
    if report.get("timings"):
        lines += ["", f"copy ceiling: {report['copy_gbps']:.0f} GB/s",
                  f"{'kernel':24s} {'ms':>9s} {'pred ms':>8s} {'stock ms':>9s} {'x stock':>8s} {'TFLOP/s':>8s} "
                  f"{'%copy':>6s}"]
        for r in report["timings"]:
            def f(v, fmt):
                return format(v, fmt) if v is not None else "-"
            lines.append(f"{r['kernel']:24s} {r['ms']:9.4f} {f(r['predicted_ms'], '8.3f')} "
                         f"{f(r['stock_ms'], '9.4f')} {f(r['ratio_vs_stock'], '8.2f')} {f(r['tflops'], '8.1f')} "
                         f"{f(r['frac_copy'] and 100 * r['frac_copy'], '6.0f')}")
    return "\n".join(lines) + "\n"


def run_checks(only: str | None) -> list[dict]:
    out = []
    for name, fn in CHECKS.items():
        if only and not name.startswith(only):
            continue
        t0 = time.perf_counter()
        try:
            passed, detail = fn()
        except Exception as exc:  # a crashed check is a failure; the others still run
            passed, detail = False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
        out.append({"name": name, "passed": bool(passed), "detail": detail,
                    "seconds": round(time.perf_counter() - t0, 3)})
        print(f"{'PASS' if passed else 'FAIL'} {name}: {detail[:400]}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path, help="directory for cuda_ops_check.json and cuda_ops_check.txt")
    ap.add_argument("--quick", action="store_true", help="checks only, no timing")
    ap.add_argument("--only", default=None, help="run the checks whose name starts with this")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--big", action="store_true", help="logp timing at T=16384 (else 4096)")
    args = ap.parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    from gradsweep.cuda_kernels import runtime

    ok, why = runtime.cuda_status()
    report: dict = {"cuda_status": [ok, why], "device": why, "checks": [], "timings": [], "copy_gbps": None,
                    "n_failed": 0}
    if ok:
        report["build_info"] = runtime.load().build_info()
        report["torch"] = torch.__version__
        report["checks"] = run_checks(args.only)
        report["n_failed"] = sum(not c["passed"] for c in report["checks"])
        if not args.quick:
            try:
                report["copy_gbps"], report["timings"] = timings(args.iters, args.big)
            except Exception as exc:  # timing trouble is reported, it does not hide the checks
                report["timing_error"] = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}"
                print(f"timing error: {report['timing_error']}", flush=True)
    else:
        report["n_failed"] = 1
        print(f"FAIL cuda_status: {why}")
    (args.outdir / "cuda_ops_check.json").write_text(json.dumps(report, indent=2, default=str))
    txt = table(report)
    (args.outdir / "cuda_ops_check.txt").write_text(txt)
    print("\n" + txt)
    return 0 if report["n_failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
