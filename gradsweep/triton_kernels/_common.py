"""The Triton family's one common module: what every kernel module of the family shares.

Why they exist: every per-row reduction must run in a launch configuration that depends on the feature
size only (``row_config``), and every token reduction must end in the same sequential FP32 fold over
per-tile partials (``fold_partials``), so that a sample's bits never depend on how it was batched. The
interpreter switches (``INTERPRET`` and its constexpr twins), the launch path (``Tuner``, and ``FastLaunch``
from ``_launch``) and the jit helpers every product and store goes through (``mma``, ``to_out``) are read from
here only.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels._launch import INTERPRET, FastLaunch
from gradsweep.triton_kernels.stage_copy import copy_pieces
from gradsweep.uploads import upload

# Constexpr twin of INTERPRET for jit code: the interpreter's fp32 -> bf16 cast truncates.
SOFT_RNE = tl.constexpr(INTERPRET)

# Under the interpreter tl.dot is numpy.matmul, i.e. the host BLAS, whose kernel is chosen by the CPU (OpenBLAS
# Haswell / Zen kernels give a row other bits at another position in the block). ``mma`` then runs a
# fixed-order product instead; on the GPU it is tl.dot itself.
PORTABLE_DOT = tl.constexpr(INTERPRET)

# Columns per program and tiles loaded ahead per loop step of the sequential fold (speed only: the
# fold's arithmetic is acc = acc + partial[t] for t in order, whatever these are).
FOLD_BLOCK = 32
FOLD_UNROLL = 8 if INTERPRET else 64


def loop_bound(n: int):
    """A kernel's runtime loop bound: a constexpr under the interpreter, a plain int on the GPU.

    The interpreter (numpy 2.4) cannot ``range()`` over a runtime scalar argument (it becomes a
    1-element array); a ``tl.constexpr`` argument stays a plain int there.
    """
    return tl.constexpr(n) if INTERPRET else n


class Tuner:
    """Config choice without ``triton.autotune``: time the candidates once per key, then launch fast.

    Every candidate keeps the reduction order (tile shapes and warps only), so the choice is a
    speed choice; ``scratch`` names an in-place argument that tuning runs must not disturb. Launches go
    through ``FastLaunch`` (the compiled kernel called directly once a specialisation exists).
    """

    def __init__(self, fn, configs: Callable[[tuple], list[triton.Config]]):
        self.fn = fn
        self.configs = configs
        self.launch = FastLaunch(fn)
        self.best: dict[tuple, triton.Config] = {}
        self.timings: dict[tuple, dict[str, float]] = {}

    @staticmethod
    def _meta(cfg: triton.Config, consts: dict, k_even: int | None) -> dict:
        meta = {**cfg.kwargs, **consts}
        if k_even is not None:  # EVEN_K follows the config's BK (loads unmasked when BK divides K)
            meta["EVEN_K"] = k_even % meta["BK"] == 0
        return meta

    def _tune(self, key: tuple, grid: Callable, args: list | None, consts: dict, scratch: int | None,
              k_even: int | None, args_for: Callable[[dict], list] | None = None) -> triton.Config:
        cands = self.configs(key)
        if len(cands) == 1:
            return cands[0]
        fixed = None
        if scratch is not None:  # every candidate starts from the same copy of the in-place argument
            first = args if args is not None else args_for(self._meta(cands[0], consts, k_even))
            fixed = first[scratch].clone()
        times = {}
        for c in cands:
            meta = self._meta(c, consts, k_even)
            targs = list(args if args is not None else args_for(meta))
            if scratch is not None:
                targs[scratch] = fixed

            def run(c=c, meta=meta, targs=targs):
                self.fn[grid(meta)](*targs, **meta, num_warps=c.num_warps, num_stages=c.num_stages)
            try:
                run()
                times[c] = triton.testing.do_bench(run, warmup=5, rep=20, return_mode="median")
            except Exception:  # out of shared memory or registers on this device: not a candidate
                times[c] = float("inf")
        self.timings[key] = {str(c): (round(t, 4) if t < float("inf") else None) for c, t in times.items()}
        return min(times, key=times.get)

    def __call__(self, key: tuple, grid: Callable, args: list | None, consts: dict, scratch: int | None = None,
                 k_even: int | None = None, args_for: Callable[[dict], list] | None = None) -> None:
        """Launch with the key's config; ``scratch``: index of an in-place argument (cloned to tune); ``args_for``
        (instead of ``args``): the arguments for a config's meta-parameters (descriptors whose boxes follow them)."""
        cfg = self.best.get(key)
        if cfg is None:
            cfg = self.best[key] = self._tune(key, grid, args, consts, scratch, k_even, args_for)
        meta = self._meta(cfg, consts, k_even)
        self.launch(grid(meta), args if args is not None else args_for(meta), meta, cfg.num_warps, cfg.num_stages)

    def memo(self, memo_key: tuple, key: tuple, grid: Callable, args: Callable[[], list] | None, consts: dict,
             scratch: int | None = None, k_even: int | None = None,
             args_for: Callable[[dict], list] | None = None) -> tuple | None:
        """``self(key, grid, args(), consts, ...)`` with the launch memoised (``FastLaunch.memo``) once the key's
        config is chosen: ``memo_key`` must determine ``args()`` exactly (every address, integer and dtype); the
        tuning key and config are added to it here. ``args_for`` (instead of ``args``): the arguments for a config's
        meta-parameters, as in ``__call__`` (descriptors whose boxes follow them); ``memo_key`` must then determine
        them for every config. Returns the key the launch is memoised under (``self.launch.replay_all`` takes it),
        None for the call that tuned (not memoised)."""
        cfg = self.best.get(key)
        if cfg is None:  # the first call of the key tunes: the ordinary path
            self(key, grid, None if args is None else args(), consts, scratch, k_even, args_for)
            return None
        meta = self._meta(cfg, consts, k_even)
        build = args if args is not None else (lambda: args_for(meta))
        launch_key = (memo_key, key)
        self.launch.memo(launch_key, lambda: (grid(meta), build(), meta, cfg.num_warps, cfg.num_stages))
        return launch_key

    def chosen(self) -> dict[str, str]:
        """Chosen config per key (benchmark reports)."""
        return {str(k): str(c) for k, c in self.best.items()}


def m_bucket(m: int) -> int:
    """Tuning key for the row count: a few buckets, so a trainer's varying R retunes rarely."""
    for b in (16, 64, 256, 1024):
        if m <= b:
            return b
    return 4096


def pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1), in integer arithmetic (``triton.next_power_of_2`` is a
    ConstexprFunction: ~5 us a call on the host, paid per launch)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers (``triton.cdiv`` costs ~5 us a call on the host: a grid of two is 10 us of a
    small launch's ~50)."""
    return -(-a // b)


def warps_for(block_elems: int) -> int:
    """num_warps for a block of ``block_elems`` elements (a function of feature sizes only)."""
    if block_elems <= 1024:
        return 4
    if block_elems <= 4096:
        return 8
    return 16


def row_config(n_features: int, tile: int) -> tuple[int, int, int]:
    """Pinned (BLOCK, ROWS, num_warps) of a row-normalising kernel: a function of the feature size only.

    ROWS rows are processed together as a [ROWS, BLOCK] block (ROWS divides ``tile``); each row's
    reduction has the same structure whichever slot it lands in, and no layout can change ROWS.
    """
    block = pow2(n_features)
    rows = max(1, min(tile, 2048 // block))
    return block, rows, warps_for(block * rows)


def rest_desc(n_rows: int, covered: tuple[np.ndarray, np.ndarray], tile: int) -> np.ndarray:
    """Descriptors (row0, count <= tile), int32 [n, 2], of the call's rows outside the ``covered`` row ranges
    (row0, count arrays of disjoint ranges): pads, rows carried to a later call, rows of staged tiles.
    O(ranges + n_rows / tile)."""
    row0, count = covered
    order = np.argsort(row0, kind="stable")
    lo = np.concatenate([[0], row0[order] + count[order]])
    hi = np.concatenate([row0[order], [n_rows]])
    keep = hi > lo
    lo, hi = lo[keep], hi[keep]
    pieces = (hi - lo + tile - 1) // tile
    nth = np.arange(int(pieces.sum())) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    first = np.repeat(lo, pieces) + tile * nth
    out = np.empty((len(first), 2), dtype=np.int32)
    out[:, 0] = first
    out[:, 1] = np.minimum(np.repeat(hi, pieces) - first, tile)
    return out


@triton.jit
def _fold_kernel(part_ptr, acc_ptr, n_tiles, n_cols, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """acc[c] = (((acc[c] + part[0, c]) + part[1, c]) + ...): one sequential FP32 chain per column.

    UNROLL partial rows are loaded ahead of their adds (latency hiding: the loads are unpredicated,
    clamped to valid rows and columns, so they can all be in flight); tiles past the end are skipped
    with tl.where, so the chain is the same whatever UNROLL or the column block is.
    """
    pid = tl.program_id(0)
    cols = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < n_cols
    safe_cols = tl.minimum(cols, n_cols - 1)
    acc = tl.load(acc_ptr + safe_cols)
    last = n_tiles - 1
    t0 = 0
    while t0 < n_tiles:  # a while loop: the interpreter (numpy 2.4) rejects range() over runtime bounds
        for u in tl.static_range(UNROLL):
            t = t0 + u
            p = tl.load(part_ptr + tl.minimum(t, last).to(tl.int64) * n_cols + safe_cols)
            acc = tl.where(t < n_tiles, acc + p, acc)
        t0 += UNROLL
    tl.store(acc_ptr + cols, acc, mask=cmask)


def norm_backward(op: str, x: torch.Tensor, dy: torch.Tensor, weight: torch.Tensor, rows: RowIdentity | None,
                  fold: CanonicalFold | None, tile: int, launch, need_dx: bool) -> torch.Tensor | None:
    """The canonical-protocol backward shared by the row-normalising kernels (rms_norm, qk_norm).

    ``launch(desc, x, dy, xs, dys, dx=, partials=, fold=, store_dx=)`` runs the op's fused kernel over tile
    descriptors (``TileStep.desc``: rows of x / dy, or of the staging xs / dys): for a fold step it writes
    dx of the call's rows it reads in place and one fp32 dweight partial per tile; the call's other rows
    (pads, rows carried to a later call or staged) get dx from a second launch without partials. The
    partials are folded into fold.main_grad in canonical order.
    """
    n_rows = x.shape[0]
    row_elems = math.prod(x.shape[1:])
    dy = dy.contiguous()
    dx = torch.empty_like(x) if need_dx else None
    dx_arg = dx if dx is not None else x

    def rest_launch(direct: tuple[np.ndarray, np.ndarray]) -> None:
        """dx of the rows the fold step did not cover (no partials); the arrays: runs read in place."""
        rest = rest_desc(n_rows, direct, tile)
        if len(rest):
            launch(upload(rest, x.device), x, dy, x, dy, dx=dx_arg,
                   partials=torch.empty(0, dtype=torch.float32, device=x.device), fold=False, store_dx=True)

    if fold is None:
        if need_dx and x.numel():
            rest_launch((np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)))
        return dx
    if rows is None or rows.num_rows != n_rows:
        raise ValueError(f"{op}: rows must describe every row of x")
    if fold.tile != tile:
        raise ValueError(f"{op}: fold.tile must be {op}.TILE={tile}, got {fold.tile}")
    step = fold.take_tiles(rows, (x, dy), stage_copy=copy_pieces)
    xs, dys = step.stage
    if row_elems and step.num_tiles:
        partials = torch.empty((step.num_tiles, weight.shape[0]), dtype=torch.float32, device=x.device)
        launch(step.desc, x, dy, xs, dys, dx=dx_arg, partials=partials, fold=True, store_dx=need_dx)
        fold_partials(partials, fold.main_grad.view(-1))
    if need_dx and x.numel() and not step.covers(n_rows):
        rest_launch(step.direct_rows())
    return dx


def norm_function(forward, backward) -> type[torch.autograd.Function]:
    """The autograd Function of a row-normalising op (rms_norm, qk_norm): y = ``forward(x, weight, eps)``; the
    backward gives dx and folds dweight into the fold's main grad (``backward(x, weight, dy, eps, rows, fold,
    need_dx=)``), so the weight's returned gradient is None."""

    class NormFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, eps, rows, fold):  # type: ignore[override]
            ctx.save_for_backward(x, weight)
            ctx.eps, ctx.rows, ctx.fold = eps, rows, fold
            return forward(x, weight, eps)

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            x, weight = ctx.saved_tensors
            dx = backward(x, weight, dy, ctx.eps, ctx.rows, ctx.fold, need_dx=ctx.needs_input_grad[0])
            return dx, None, None, None, None

    return NormFn


_FOLD = FastLaunch(_fold_kernel)


def fold_partials(partials: torch.Tensor, acc: torch.Tensor) -> None:
    """Fold per-tile FP32 partials [n_tiles, C] into ``acc`` (flat C) in tile order, in place."""
    n_tiles, n_cols = partials.shape
    if n_tiles == 0 or n_cols == 0:
        return
    _FOLD((cdiv(n_cols, FOLD_BLOCK),), [partials, acc, n_tiles, n_cols],
          {"BLOCK": FOLD_BLOCK, "UNROLL": FOLD_UNROLL}, num_warps=1)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Raw bits of a float tensor as a same-sized integer tensor (NaNs canonicalised)."""
    t = t.detach()
    if t.dtype in (torch.bfloat16, torch.float16):
        b = t.contiguous().view(torch.int16)
        nan = torch.full_like(b, 0x7FC0 if t.dtype == torch.bfloat16 else 0x7E00)
    elif t.dtype == torch.float32:
        b = t.contiguous().view(torch.int32)
        nan = torch.full_like(b, 0x7FC00000)
    elif t.dtype == torch.float64:
        b = t.contiguous().view(torch.int64)
        nan = torch.full_like(b, 0x7FF8000000000000)
    else:
        return t
    return torch.where(torch.isnan(t), nan, b)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equality (any NaN equals any NaN; +0 and -0 differ)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(bits(a), bits(b)))


@triton.jit
def cast_out(x, dtype: tl.constexpr, SOFT_RNE: tl.constexpr):
    """fp32 -> output dtype with round-to-nearest-even.

    On the GPU the hardware conversion is RNE; the interpreter's own fp32->bf16 cast truncates, so
    there (SOFT_RNE) bf16 is rounded with integer arithmetic (the classic +0x7FFF + lsb trick).
    """
    if SOFT_RNE and dtype == tl.bfloat16:
        b = x.to(tl.uint32, bitcast=True)
        b = b + 0x7FFF + ((b >> 16) & 1)
        return (b >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return x.to(dtype)


@triton.jit
def mma(a, b, acc):
    """``tl.dot(a, b, acc)`` (acc may be None) whose bits do not depend on the host CPU.

    On the GPU (PORTABLE_DOT false) this is tl.dot, unchanged. Under the interpreter it never touches BLAS:
    exact FP32 products (bf16 x bf16 fits in FP32) summed along K by numpy's reduction, whose order is a
    function of the block shape only, the same for every row and column and on every CPU; then added to
    acc as tl.dot does (acc + a @ b). Operands of any float dtype: this path upcasts itself (the
    interpreter's bf16 dot is wrong), so callers need no UPCAST of their own before it.

    Why a nested jit helper and not an inline pattern: the interpreter re-patches the language on every
    nested call, measured at ~0.1 ms a call (5-8% of one 64x64x32 product), and no difference at all on
    the GEMM kernel tests (13.45 s either way, triton 3.6); on the GPU it is inlined.
    """
    if PORTABLE_DOT:
        prod = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
        if acc is None:
            return prod
        else:
            return acc + prod
    else:
        return tl.dot(a, b, acc)


@triton.jit
def tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped (swizzled) tile order: GROUP_M row tiles share each column tile in L2."""
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def to_out(x, dtype: tl.constexpr):
    """Cast an fp32 result to an output pointer's dtype with round-to-nearest-even everywhere."""
    return cast_out(x, dtype, SOFT_RNE)
