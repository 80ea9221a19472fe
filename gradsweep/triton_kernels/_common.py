"""Helpers shared by the Triton kernel modules.

Why they exist: every per-row reduction must run in a launch configuration that depends on the feature
size only (``row_config``), and every token reduction must end in the same sequential FP32 fold over
per-tile partials (``fold_partials``), so that a sample's bits never depend on how it was batched.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity

# Read once, before any kernel below is decorated: TRITON_INTERPRET must be set before import.
INTERPRET: bool = os.environ.get("TRITON_INTERPRET") == "1"

# Constexpr twin of INTERPRET for jit code: the interpreter's fp32 -> bf16 cast truncates.
SOFT_RNE = tl.constexpr(INTERPRET)

# Columns per program and tiles loaded ahead per loop step of the sequential fold (speed only: the
# fold's arithmetic is acc = acc + partial[t] for t in order, whatever these are).
FOLD_BLOCK = 32
FOLD_UNROLL = 8 if INTERPRET else 64


def pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return int(triton.next_power_of_2(max(int(n), 1)))


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


def require_fold(fold: CanonicalFold | None, weight: torch.Tensor, op: str) -> None:
    """Fail early: a weight gradient without a canonical fold would have nowhere to go."""
    if fold is None and weight.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{op}: weight requires grad but fold is None; pass a CanonicalFold "
                         "(the weight gradient is folded into fold.main_grad, never returned)")
    if fold is not None:
        if fold.main_grad.device != weight.device or fold.main_grad.shape != weight.shape:
            raise ValueError(f"{op}: fold.main_grad must be an fp32 tensor shaped like the weight "
                             f"{tuple(weight.shape)} on {weight.device}")


def folded_row_mask(rows: RowIdentity, fold: CanonicalFold, first_tile: int, num_tiles: int) -> np.ndarray:
    """Which of this call's rows a fold step covers (host side, from the rows' logical identity).

    Uses only the fold's public ``lengths`` and ``tile``: the canonical tile of (sample, position).
    """
    sample = rows.sample.cpu().numpy()
    position = rows.position.cpu().numpy()
    tiles_per_sample = (fold.lengths + fold.tile - 1) // fold.tile
    base = np.concatenate([[0], np.cumsum(tiles_per_sample)]).astype(np.int64)
    real = sample >= 0
    tile_of = np.full(sample.shape, -1, dtype=np.int64)
    tile_of[real] = base[sample[real]] + position[real] // fold.tile
    return real & (tile_of >= first_tile) & (tile_of < first_tile + num_tiles)


def leftover_table(rows_idx: np.ndarray, offset: int, tile: int, device: torch.device) -> torch.Tensor | None:
    """int32 [n, tile] table of source rows (``rows_idx + offset``, -1 padded) or None when empty."""
    if rows_idx.size == 0:
        return None
    n = (rows_idx.size + tile - 1) // tile
    table = np.full(n * tile, -1, dtype=np.int32)
    table[: rows_idx.size] = rows_idx + offset
    return torch.as_tensor(table.reshape(n, tile), device=device)


def own_rows_table(n_rows: int, tile: int, device: torch.device) -> torch.Tensor:
    """Every row of the call, in order, as an int32 [n, tile] table (used when no fold is needed)."""
    n = (n_rows + tile - 1) // tile
    idx = torch.arange(n * tile, dtype=torch.int32, device=device)
    return torch.where(idx < n_rows, idx, torch.full_like(idx, -1)).view(n, tile)


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

    ``launch(work, x, dy, dx=, partials=, n_carried=, fold=, store_dx=)`` runs the op's fused kernel over a
    table of row indices: for a fold step it writes dx of its rows and one fp32 dweight partial per
    tile; rows that no ready tile covers (pads, rows carried to a later call) get dx from a second
    launch without partials. The partials are folded into fold.main_grad in canonical order.
    """
    n_rows = x.shape[0]
    row_elems = int(np.prod(x.shape[1:]))
    dy = dy.contiguous()
    dx = torch.empty_like(x) if need_dx else None
    dx_arg = dx if dx is not None else x
    empty = torch.empty(0, dtype=torch.float32, device=x.device)
    if fold is None:
        if need_dx and x.numel():
            launch(own_rows_table(n_rows, tile, x.device), x, dy, dx=dx_arg, partials=empty, n_carried=0,
                   fold=False, store_dx=True)
        return dx
    if rows is None or rows.num_rows != n_rows:
        raise ValueError(f"{op}: rows must describe every row of x")
    if fold.tile != tile:
        raise ValueError(f"{op}: fold.tile must be {op}.TILE={tile}, got {fold.tile}")
    first = fold.cursor
    step = fold.take(rows, (x, dy))
    src_x, src_dy = step.tensors
    n_carried = src_x.shape[0] - n_rows
    if row_elems and step.num_tiles:
        partials = torch.empty((step.num_tiles, weight.shape[0]), dtype=torch.float32, device=x.device)
        launch(step.plan, src_x, src_dy, dx=dx_arg, partials=partials, n_carried=n_carried, fold=True,
               store_dx=need_dx)
        fold_partials(partials, fold.main_grad.view(-1))
    if need_dx and x.numel():
        covered = folded_row_mask(rows, fold, first, step.num_tiles)
        rest = leftover_table(np.nonzero(~covered)[0], n_carried, tile, x.device)
        if rest is not None:
            launch(rest, src_x, src_dy, dx=dx_arg, partials=empty, n_carried=n_carried, fold=False, store_dx=True)
    return dx


def fold_partials(partials: torch.Tensor, acc: torch.Tensor) -> None:
    """Fold per-tile FP32 partials [n_tiles, C] into ``acc`` (flat C) in tile order, in place."""
    n_tiles, n_cols = partials.shape
    if n_tiles == 0 or n_cols == 0:
        return
    grid = (triton.cdiv(n_cols, FOLD_BLOCK),)
    _fold_kernel[grid](partials, acc, n_tiles, n_cols, BLOCK=FOLD_BLOCK, UNROLL=FOLD_UNROLL, num_warps=1)


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
def to_out(x, dtype: tl.constexpr):
    """Cast an fp32 result to an output pointer's dtype with round-to-nearest-even everywhere."""
    return cast_out(x, dtype, SOFT_RNE)
