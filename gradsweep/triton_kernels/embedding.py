"""Embedding gather with a deterministic, canonical weight gradient (no read-modify-write races).

Forward copies weight rows (bit-exact, row-wise). Backward: the fold plan lists the call's ready
tokens in canonical (sample, position) order (TILE = 1); a stable sort by id keeps that order inside
each id's segment, and one program per (segment, column block) loads main_grad[id], adds the
segment's dy rows one after another in FP32, and stores it back. Every vocabulary row therefore sees
the same chain of adds in every layout; pads never enter the plan.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.triton_kernels._common import pow2, require_fold

TILE: int = 1
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
def _embed_bwd_kernel(cand_ptr, sorted_ids_ptr, src_ptr, seg_start_ptr, seg_end_ptr, dy_ptr, acc_ptr, H,
                      BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Program (p, c), i = cand[p]: if i starts its id's segment, fold dy[src[i..end)] into acc[id] in order."""
    i = tl.load(cand_ptr + tl.program_id(0))
    cols = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    cmask = cols < H
    safe_cols = tl.minimum(cols, H - 1)
    head = tl.load(seg_start_ptr + i) == i
    end = tl.where(head, tl.load(seg_end_ptr + i).to(tl.int32), i)
    vid = tl.load(sorted_ids_ptr + i).to(tl.int64)
    acc = tl.load(acc_ptr + vid * H + cols, mask=cmask & head, other=0.0)
    j0 = i
    while j0 < end:
        for u in tl.static_range(UNROLL):
            j = j0 + u
            # unpredicated loads (clamped to the segment) so that all UNROLL rows can be in flight
            tok = tl.load(src_ptr + tl.minimum(j, end - 1)).to(tl.int64)
            row = tl.load(dy_ptr + tok * H + safe_cols).to(tl.float32)
            acc = tl.where(j < end, acc + row, acc)
        j0 += UNROLL
    tl.store(acc_ptr + vid * H + cols, acc, mask=cmask & head)


def embedding_forward(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Gather launcher (no autograd); ids must lie in [0, V)."""
    n_rows, hidden = ids.shape[0], weight.shape[1]
    y = torch.empty((n_rows, hidden), dtype=weight.dtype, device=weight.device)
    if y.numel() == 0:
        return y
    rows = max(1, 4096 // min(pow2(hidden), BLOCK_H))
    grid = (triton.cdiv(n_rows, rows), triton.cdiv(hidden, BLOCK_H))
    _embed_fwd_kernel[grid](ids.contiguous(), weight.contiguous(), y, n_rows, hidden, ROWS=rows,
                            BLOCK=min(pow2(hidden), BLOCK_H), num_warps=4)
    return y


def embedding_fold(step_tokens: torch.Tensor, ids_src: torch.Tensor, dy_src: torch.Tensor,
                   main_grad: torch.Tensor) -> None:
    """Fold dy rows ``step_tokens`` (canonical order, indices into ids_src / dy_src) into main_grad."""
    n = step_tokens.numel()
    hidden = dy_src.shape[1]
    if n == 0 or hidden == 0:
        return
    tok_ids = ids_src.index_select(0, step_tokens)
    sorted_ids, order = torch.sort(tok_ids, stable=True)
    src = step_tokens.index_select(0, order).to(torch.int32).contiguous()
    seg_start = torch.searchsorted(sorted_ids, sorted_ids, right=False).to(torch.int32)
    seg_end = torch.searchsorted(sorted_ids, sorted_ids, right=True).to(torch.int32)
    # Candidate segment heads: every position on a GPU (non-heads exit at once; no host sync), only
    # the true heads on the CPU (the interpreter pays per program). Same kernel, same arithmetic.
    if sorted_ids.device.type == "cpu":
        cand = torch.nonzero(seg_start == torch.arange(n, dtype=torch.int32)).view(-1).to(torch.int32)
    else:
        cand = torch.arange(n, dtype=torch.int32, device=sorted_ids.device)
    block = min(pow2(hidden), BLOCK_H)
    grid = (cand.numel(), triton.cdiv(hidden, block))
    _embed_bwd_kernel[grid](cand, sorted_ids.contiguous(), src, seg_start, seg_end, dy_src, main_grad, hidden,
                            BLOCK=block, UNROLL=UNROLL, num_warps=4)


def embedding_backward(ids: torch.Tensor, dy: torch.Tensor, rows: RowIdentity, fold: CanonicalFold) -> None:
    """Take this call's tokens into the fold and fold the ready ones into fold.main_grad."""
    if rows is None or rows.num_rows != ids.shape[0]:
        raise ValueError("embedding: rows must describe every row of ids")
    if fold.tile != TILE:
        raise ValueError(f"embedding: fold.tile must be embedding.TILE={TILE}, got {fold.tile}")
    step = fold.take(rows, (dy.contiguous(), ids))
    dy_src, ids_src = step.tensors
    tokens = step.plan.reshape(-1)
    if tokens.device.type == "cpu" and bool((tokens < 0).any()):  # checked where it costs no sync
        raise AssertionError("embedding: a TILE=1 plan never holds zero rows")
    embedding_fold(tokens.to(torch.int64), ids_src, dy_src, fold.main_grad)


class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids, weight, rows, fold):  # type: ignore[override]
        ctx.save_for_backward(ids)
        ctx.rows, ctx.fold = rows, fold
        return embedding_forward(ids, weight)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (ids,) = ctx.saved_tensors
        if ctx.fold is not None:
            embedding_backward(ids, dy, ctx.rows, ctx.fold)
        return None, None, None, None


def embedding(ids: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
              fold: CanonicalFold | None) -> torch.Tensor:
    """weight[ids] for ids [R] (int64, weight's device); dweight goes into fold.main_grad [V, H]."""
    if ids.dim() != 1 or weight.dim() != 2:
        raise ValueError(f"embedding: expected ids [R] and weight [V, H], got {tuple(ids.shape)}, "
                         f"{tuple(weight.shape)}")
    if ids.device != weight.device:
        raise ValueError("embedding: ids must be on the weight's device")
    if ids.device.type == "cpu" and ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= weight.shape[0]):
        raise ValueError("embedding: an id lies outside the vocabulary")
    require_fold(fold, weight, "embedding")
    return _EmbeddingFn.apply(ids, weight, rows, fold)
