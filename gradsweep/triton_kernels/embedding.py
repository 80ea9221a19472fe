"""Embedding gather with a deterministic, canonical weight gradient (no read-modify-write races).

Forward copies weight rows (bit-exact, row-wise). Backward: the fold step's tiles list the call's ready
tokens in canonical (sample, position) order; a stable sort by id keeps that order inside each id's
segment, and one program per (segment, column block) loads main_grad[id], adds the segment's dy rows one
after another in FP32, and stores it back. Every vocabulary row therefore sees the same chain of adds in
canonical token order in every layout, whatever the tile size (TILE only decides how long tokens wait for
their tile: a per-id chain does not depend on how tokens are grouped); pads never enter a tile.
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity, TileStep
from gradsweep.kernel_api import check_embedding, embedding_function, require_fold, run_function
from gradsweep.triton_kernels._common import FastLaunch, cdiv, pow2, upload
from gradsweep.triton_kernels.stage_copy import copy_pieces

TILE: int = 64  # canonical tile of the fold (plans cost O(tiles); the bits do not depend on it)
BLOCK_H = 1024  # columns per program (elementwise along H: any value gives the same bits)
UNROLL = 4  # dy rows loaded ahead of their adds


@triton.jit
def _embed_fwd_kernel(ids_ptr, w_ptr, y_ptr, n_rows, H, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rmask = r < n_rows
    ids = tl.load(ids_ptr + r, mask=rmask, other=0).to(tl.int64)
    m = rmask[:, None] & (cols < H)[None, :]
    v = tl.load(w_ptr + ids[:, None] * H + cols[None, :], mask=m, other=0.0)
    tl.store(y_ptr + r[:, None] * H + cols[None, :], v, mask=m)


@triton.jit
def _tokens_kernel(desc_ptr, off_ptr, ids_ptr, ids_stage_ptr, tok_ptr, tok_id_ptr, TILE: tl.constexpr):
    """Tile t of a fold step -> its tokens in slot order: ``tok`` = row of the call (>= 0) or -1 - staging
    row, and the token's id."""
    t = tl.program_id(0)
    row0 = tl.load(desc_ptr + 2 * t)
    count = tl.load(desc_ptr + 2 * t + 1)
    staged = row0 < 0
    first = tl.where(staged, -row0 - 1, row0)
    j = tl.arange(0, TILE)
    live = j < count
    ids = tl.where(staged, ids_stage_ptr, ids_ptr)
    vid = tl.load(ids + first + j, mask=live, other=0)
    out = tl.load(off_ptr + t) + j
    tl.store(tok_ptr + out, tl.where(staged, -1 - (first + j), first + j), mask=live)
    tl.store(tok_id_ptr + out, vid, mask=live)


@triton.jit
def _embed_bwd_kernel(cand_ptr, sorted_ids_ptr, src_ptr, seg_start_ptr, seg_end_ptr, dy_ptr, dys_ptr, acc_ptr, H,
                      BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Program (p, c), i = cand[p]: if i starts its id's segment, fold dy[src[i..end)] into acc[id] in order.

    ``src`` holds signed tokens: a row of dy (>= 0) or -1 - a row of the staging dys.
    """
    i = tl.load(cand_ptr + tl.program_id(0))
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < H
    safe_cols = tl.minimum(cols, H - 1)
    head = tl.load(seg_start_ptr + i) == i
    end = tl.where(head, tl.load(seg_end_ptr + i).to(tl.int32), i)
    vid = tl.load(sorted_ids_ptr + i).to(tl.int64)
    # where, not ``cmask & head``: the interpreter makes block & scalar an int32 mask, which triton >= 3.9 rejects
    hmask = tl.where(head, cmask, False)
    acc = tl.load(acc_ptr + vid * H + cols, mask=hmask, other=0.0)
    j0 = i
    while j0 < end:
        for u in tl.static_range(UNROLL):
            j = j0 + u
            # unpredicated loads (clamped to the segment) so that all UNROLL rows can be in flight
            tok = tl.load(src_ptr + tl.minimum(j, end - 1)).to(tl.int64)
            staged = tok < 0
            rows = tl.where(staged, dys_ptr, dy_ptr)
            row = tl.load(rows + tl.where(staged, -1 - tok, tok) * H + safe_cols).to(tl.float32)
            acc = tl.where(j < end, acc + row, acc)
        j0 += UNROLL
    tl.store(acc_ptr + vid * H + cols, acc, mask=hmask)


_FWD = FastLaunch(_embed_fwd_kernel)
_TOKENS = FastLaunch(_tokens_kernel)
_BWD = FastLaunch(_embed_bwd_kernel)


def embedding_forward(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Gather launcher (no autograd); ids must lie in [0, V)."""
    n_rows, hidden = ids.shape[0], weight.shape[1]
    y = torch.empty((n_rows, hidden), dtype=weight.dtype, device=weight.device)
    if y.numel() == 0:
        return y
    rows = max(1, 4096 // min(pow2(hidden), BLOCK_H))
    grid = (cdiv(n_rows, rows), cdiv(hidden, BLOCK_H))
    _FWD(grid, [ids.contiguous(), weight.contiguous(), y, n_rows, hidden],
         {"ROWS": rows, "BLOCK": min(pow2(hidden), BLOCK_H)}, num_warps=4)
    return y


def step_tokens(step: TileStep, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(signed tokens int32, their ids) of a fold step's tiles, in canonical order (see ``_tokens_kernel``)."""
    d = step.host_desc
    total = int(d[:, 1].sum())
    if d[0, 0] >= 0 and (d[1:, 0] == d[:-1, 0] + d[:-1, 1]).all():  # one stretch of the call's rows, in order
        a = int(d[0, 0])
        return torch.arange(a, a + total, dtype=torch.int32, device=ids.device), ids[a:a + total]
    off = np.concatenate([[0], np.cumsum(d[:-1, 1])]).astype(np.int32)
    tok = torch.empty(total, dtype=torch.int32, device=ids.device)
    tok_ids = torch.empty(total, dtype=ids.dtype, device=ids.device)
    _TOKENS((step.num_tiles,), [step.desc, upload(off, ids.device), ids, step.stage[1], tok, tok_ids],
            {"TILE": step.tile}, num_warps=1)
    return tok, tok_ids


def embedding_fold(tokens: torch.Tensor, tok_ids: torch.Tensor, dy: torch.Tensor, dys: torch.Tensor,
                   main_grad: torch.Tensor) -> None:
    """Fold dy rows ``tokens`` (canonical order; signed: dy row, or -1 - dys row) with ids ``tok_ids`` into
    main_grad [V, H]."""
    n = tokens.numel()
    hidden = dy.shape[1]
    if n == 0 or hidden == 0:
        return
    sorted_ids, order = torch.sort(tok_ids, stable=True)
    src = tokens.index_select(0, order).to(torch.int32).contiguous()
    # int32 bounds straight from the search (a cast would be one more launch each: this op is host-bound)
    seg_start = torch.searchsorted(sorted_ids, sorted_ids, right=False, out_int32=True)
    seg_end = torch.searchsorted(sorted_ids, sorted_ids, right=True, out_int32=True)
    # Candidate segment heads: every position on a GPU (non-heads exit at once; no host sync), only
    # the true heads on the CPU (the interpreter pays per program). Same kernel, same arithmetic.
    if sorted_ids.device.type == "cpu":
        cand = torch.nonzero(seg_start == torch.arange(n, dtype=torch.int32)).view(-1).to(torch.int32)
    else:
        cand = torch.arange(n, dtype=torch.int32, device=sorted_ids.device)
    block = min(pow2(hidden), BLOCK_H)
    grid = (cand.numel(), cdiv(hidden, block))
    _BWD(grid, [cand, sorted_ids.contiguous(), src, seg_start, seg_end, dy, dys, main_grad, hidden],
         {"BLOCK": block, "UNROLL": UNROLL}, num_warps=4)


def embedding_backward(ids: torch.Tensor, dy: torch.Tensor, rows: RowIdentity, fold: CanonicalFold) -> None:
    """Take this call's tokens into the fold and fold the ready ones into fold.main_grad."""
    if rows is None or rows.num_rows != ids.shape[0]:
        raise ValueError("embedding: rows must describe every row of ids")
    if fold.tile != TILE:
        raise ValueError(f"embedding: fold.tile must be embedding.TILE={TILE}, got {fold.tile}")
    dy, ids = dy.contiguous(), ids.contiguous()
    step = fold.take_tiles(rows, (dy, ids), stage_copy=copy_pieces)
    if step.num_tiles == 0:
        return
    tokens, tok_ids = step_tokens(step, ids)
    embedding_fold(tokens, tok_ids, dy, step.stage[0], fold.main_grad)


_EmbeddingFn = embedding_function(embedding_forward, embedding_backward)


def embedding(ids: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
              fold: CanonicalFold | None) -> torch.Tensor:
    """weight[ids] for ids [R] (int64, weight's device); dweight goes into fold.main_grad [V, H]."""
    check_embedding(ids, weight)
    if ids.device != weight.device:
        raise ValueError("embedding: ids must be on the weight's device")
    if ids.device.type == "cpu" and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0]):
        raise ValueError("embedding: an id lies outside the vocabulary")
    require_fold(fold, weight, "embedding")
    return run_function(_EmbeddingFn, ids, weight, rows, fold)
