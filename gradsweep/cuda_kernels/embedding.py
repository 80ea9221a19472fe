"""Embedding gather with a deterministic, canonical weight gradient (gradsweep._C; no atomics).

Forward copies weight rows (bit-exact, row-wise; an id outside [0, V) yields a zero row rather than a
read out of bounds). Backward: the fold plan lists the call's ready tokens in canonical (sample, position)
order (TILE = 1); a stable sort by id keeps that order inside each id's run, and one CUDA block per
(run, column block) loads main_grad[id], adds the run's dy rows one after another in FP32, and stores it
back (csrc/gather.cu). Every vocabulary row therefore sees the same chain of adds in every layout; pads
never enter the plan.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.cuda_kernels import runtime as rt
from gradsweep.cuda_kernels.stage_copy import copy_pieces
from gradsweep.kernel_api import check_embedding, embedding_function, require_fold, run_function

TILE: int = 1


def embedding_forward(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Gather launcher (no autograd)."""
    n_rows, (vocab, hidden) = ids.shape[0], weight.shape
    y = torch.empty((n_rows, hidden), dtype=weight.dtype, device=weight.device)
    if y.numel() == 0:
        return y
    ids = ids.to(torch.int64).contiguous()
    weight = weight.contiguous()
    dev, stream = rt.launch(weight)
    rt.ext().embedding_fwd(rt.ptr(ids), rt.ptr(weight), rt.ptr(y), n_rows, vocab, hidden, dev, stream)
    return y


def embedding_fold(step_tokens: torch.Tensor, ids_src: torch.Tensor, dy_src: torch.Tensor,
                   main_grad: torch.Tensor) -> None:
    """Fold dy rows ``step_tokens`` (canonical order, indices into ids_src / dy_src) into main_grad."""
    n = step_tokens.numel()
    vocab, hidden = main_grad.shape
    if n == 0 or hidden == 0:
        return
    tok_ids = ids_src.index_select(0, step_tokens).to(torch.int64)
    sorted_ids, order = torch.sort(tok_ids, stable=True)
    sorted_ids = sorted_ids.contiguous()
    src = step_tokens.index_select(0, order).to(torch.int32).contiguous()
    dy_src = dy_src.to(torch.bfloat16).contiguous()
    dev, stream = rt.launch(dy_src)
    rt.ext().embedding_fold(rt.ptr(sorted_ids), rt.ptr(src), n, rt.ptr(dy_src), rt.ptr(main_grad),
                            vocab, hidden, dev, stream)


def embedding_backward(ids: torch.Tensor, dy: torch.Tensor, rows: RowIdentity, fold: CanonicalFold) -> None:
    """Take this call's tokens into the fold and fold the ready ones into fold.main_grad."""
    if rows is None or rows.num_rows != ids.shape[0]:
        raise ValueError("embedding: rows must describe every row of ids")
    if fold.tile != TILE:
        raise ValueError(f"embedding: fold.tile must be embedding.TILE={TILE}, got {fold.tile}")
    step = fold.take(rows, (dy.contiguous(), ids), stage_copy=copy_pieces)
    dy_src, ids_src = step.tensors
    tokens = step.plan.reshape(-1)
    if tokens.device.type == "cpu" and bool((tokens < 0).any()):  # checked where it costs no sync
        raise AssertionError("embedding: a TILE=1 plan never holds zero rows")
    embedding_fold(tokens.to(torch.int64), ids_src, dy_src, fold.main_grad)


_EmbeddingFn = embedding_function(embedding_forward, embedding_backward)


def embedding(ids: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
              fold: CanonicalFold | None) -> torch.Tensor:
    """weight[ids] for ids [R] (int64, weight's device); dweight goes into fold.main_grad [V, H]."""
    check_embedding(ids, weight)
    rt.check_tensor("embedding weight", weight)
    if ids.device != weight.device:
        raise ValueError("embedding: ids must be on the weight's device")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"embedding: ids must be integers, got {ids.dtype}")
    require_fold(fold, weight, "embedding")
    return run_function(_EmbeddingFn, ids, weight, rows, fold)
