"""Batch-invariant GEMM (``det_linear``) with a canonical-fold dW, in CUDA C++ (gradsweep._C).

Why it is batch-invariant (csrc/mma_gemm.cuh):
- forward and dX are tensor-core GEMMs (mma.sync m16n8k16, fp32 accumulate) with one sequential K loop of
  16-wide mma steps and no split of K: the tile configuration follows M (a speed choice), the chain of k
  steps an output element sees never does;
- dW is a GEMM whose reduction axis is the token axis, run over the canonical token tiles of a
  ``FoldStep`` plan (rows gathered through the plan, ``-1`` rows zero-filled at the load, never multiplied),
  with its fp32 accumulator LOADED from main_grad before the loop and stored back: the same tiles in the
  same order whatever the batching, so B=N, N x B=1, chunked, padded and permuted calls give the same bits.

Same public API as ``gradsweep.triton_kernels.gemm`` (det_linear, matmul_invariant, matmul_accumulate,
dw_fold, dw_fold_raw, TILE). bf16 operands only; no torch GEMM anywhere on this path.
"""

from __future__ import annotations

import torch

from gradsweep.canonical import CanonicalFold, FoldStep, RowIdentity
from gradsweep.cuda_kernels import runtime as rt
from gradsweep.cuda_kernels.stage_copy import copy_pieces
from gradsweep.kernel_api import check_linear, require_fold, run_function

OUT_BF16, OUT_F32_CHAIN, OUT_F32_ADD = 0, 1, 2  # gemm_nn's ``out`` (csrc/gradsweep.h: kNnBf16, ...)
TILE = 64  # canonical token tile of the dW fold (a multiple of 16: every call's mma steps stay on the same slots)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def matmul_invariant(a: torch.Tensor, b_t: torch.Tensor,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a @ b_t.T (b_t is [N, K], weight layout; any strides), bf16 out, one K order for every M."""
    if a.dim() != 2 or b_t.dim() != 2 or a.shape[1] != b_t.shape[1]:
        raise ValueError(f"matmul_invariant: shapes {tuple(a.shape)} x {tuple(b_t.shape)}^T do not match")
    if (out_dtype or a.dtype) != torch.bfloat16:
        raise ValueError(f"matmul_invariant: the CUDA GEMM writes bfloat16, not {out_dtype}")
    rt.check_tensor("matmul_invariant a", a)
    rt.check_tensor("matmul_invariant b_t", b_t)
    return _product_nt(_rows_contiguous(a), b_t)


def _product_nt(a: torch.Tensor, b_t: torch.Tensor) -> torch.Tensor:
    """``matmul_invariant`` on checked operands (a with unit column stride)."""
    m, k = a.shape
    n = b_t.shape[0]
    out = torch.empty(m, n, dtype=torch.bfloat16, device=a.device)
    if m == 0 or n == 0:
        return out
    dev, stream = rt.launch(a)
    ext = rt.ext()
    if b_t.stride(1) != 1 and b_t.stride(0) == 1 and n > 1:
        b = b_t.t()  # [K, N] with unit column stride: the N-major kernel reads it in place (dX = dY @ W)
        ext.gemm_nn(rt.ptr(a), rt.ptr(b), rt.ptr(out), m, n, k, a.stride(0), b.stride(0), out.stride(0), OUT_BF16,
                    dev, stream)
        return out
    b_t = _rows_contiguous(b_t)
    ext.gemm_nt(rt.ptr(a), rt.ptr(b_t), rt.ptr(out), m, n, k, a.stride(0), b_t.stride(0), out.stride(0), dev,
                stream)
    return out


def _matmul_into(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor, out: int, what: str) -> torch.Tensor:
    if acc.dtype != torch.float32 or acc.shape != (a.shape[0], b.shape[1]) or a.shape[1] != b.shape[0]:
        raise ValueError(f"{what}: acc must be fp32 [M, N] for a [M, K] and b [K, N]")
    rt.check_tensor(f"{what} a", a)
    rt.check_tensor(f"{what} b", b)
    rt.check_tensor(f"{what} acc", acc, torch.float32)
    if acc.stride(1) != 1:
        raise ValueError(f"{what}: acc must have contiguous rows (it is updated in place)")
    a, b = _rows_contiguous(a), _rows_contiguous(b)
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return acc
    dev, stream = rt.launch(a)
    rt.ext().gemm_nn(rt.ptr(a), rt.ptr(b), rt.ptr(acc), m, n, k, a.stride(0), b.stride(0), acc.stride(0), out,
                     dev, stream)
    return acc


def matmul_accumulate(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """acc[M,N] (fp32) += a[M,K] @ b[K,N], the accumulator loaded into the GEMM (chains keep one order)."""
    return _matmul_into(a, b, acc, OUT_F32_CHAIN, "matmul_accumulate")


def matmul_add(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """acc[M,N] (fp32) += round_fp32(a[M,K] @ b[K,N]): the product's chain from zero, added with one rounding
    (what the Hopper GEMM's epilogue computes, so it runs there; a sum of such calls is a sum of products)."""
    return _matmul_into(a, b, acc, OUT_F32_ADD, "matmul_add")


def dw_fold(step: FoldStep, main_grad: torch.Tensor, x_index: int = 0, dy_index: int = 1) -> torch.Tensor:
    """Fold the step's canonical tiles of dY^T X into fp32 ``main_grad`` [N, K] (in place).

    ``step.bases[x_index]`` holds X's carried rows and this call's X [S, K], ``step.bases[dy_index]`` dY's
    [S, N]; rows are read through ``step.plan``, the carried ones in place from the fold's staging (no copy of
    the call's rows). The kernel loads main_grad, folds tile after tile, stores it.
    """
    (x_st, x), (dy_st, dy) = step.bases[x_index], step.bases[dy_index]
    stage = (x_st, dy_st, step.n_stage) if step.n_stage else None
    return dw_fold_raw(step.plan, x, dy, main_grad, stage)


def dw_fold_raw(plan: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor,
                stage: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> torch.Tensor:
    """The fold kernel on explicit tensors (plan [n_tiles, tile] int32; main_grad may be a row slice).

    ``stage``: (X's, dY's carried rows, their count n): plan rows below n are theirs, row r >= n is row r - n of
    ``x`` / ``dy`` (``FoldStep``'s row space); None: the plan indexes ``x`` / ``dy`` alone.
    """
    n, k = main_grad.shape
    if main_grad.dtype != torch.float32 or main_grad.stride(1) != 1:
        raise ValueError("dw_fold: main_grad must be fp32 with contiguous rows")
    if x.shape[1] != k or dy.shape[1] != n or x.shape[0] != dy.shape[0]:
        raise ValueError(f"dw_fold: X {tuple(x.shape)}, dY {tuple(dy.shape)} do not fit main_grad {(n, k)}")
    x_st, dy_st, n_stage = (x, dy, 0) if stage is None else stage
    if n_stage and (x_st.shape[0] < n_stage or dy_st.shape[0] < n_stage or x_st.shape[1] != k
                    or dy_st.shape[1] != n):
        raise ValueError(f"dw_fold: carried X {tuple(x_st.shape)}, dY {tuple(dy_st.shape)} do not hold {n_stage} "
                         f"rows of widths {k} / {n}")
    n_tiles, bt = plan.shape
    if n_tiles == 0 or n == 0 or k == 0:
        return main_grad
    if bt % 16:
        raise ValueError(f"dw_fold: the fold tile must be a multiple of 16, got {bt}")
    rt.check_tensor("dw_fold X", x)
    rt.check_tensor("dw_fold dY", dy)
    rt.check_tensor("dw_fold main_grad", main_grad, torch.float32)
    x, dy = _rows_contiguous(x), _rows_contiguous(dy)
    plan = rt.like(plan, x, torch.int32)
    dev, stream = rt.launch(x)
    ext = rt.ext()
    if not n_stage:
        ext.gemm_dw_fold(rt.ptr(plan), n_tiles, bt, rt.ptr(dy), rt.ptr(x), rt.ptr(main_grad), x.shape[0], n, k,
                         dy.stride(0), x.stride(0), main_grad.stride(0), dev, stream)
        return main_grad
    rt.check_tensor("dw_fold carried X", x_st)
    rt.check_tensor("dw_fold carried dY", dy_st)
    x_st, dy_st = _rows_contiguous(x_st), _rows_contiguous(dy_st)
    ext.gemm_dw_fold(rt.ptr(plan), n_tiles, bt, rt.ptr(dy), rt.ptr(x), rt.ptr(main_grad), x.shape[0], n, k,
                     dy.stride(0), x.stride(0), main_grad.stride(0), dev, stream, stage_dy=rt.ptr(dy_st),
                     stage_x=rt.ptr(x_st), n_stage=n_stage, stage_ldy=dy_st.stride(0), stage_ldx=x_st.stride(0))
    return main_grad


class DetLinearFn(torch.autograd.Function):
    """y = x @ W^T; backward dX by the invariant GEMM, dW folded into fold.main_grad (grad None)."""

    @staticmethod
    def forward(ctx, x, weight, rows, fold):  # type: ignore[override]
        ctx.save_for_backward(x, weight)
        ctx.rows, ctx.fold = rows, fold
        return _product_nt(x, weight)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight = ctx.saved_tensors
        dy = dy.to(torch.bfloat16).contiguous()
        dx = matmul_invariant(dy, weight.t()) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            if ctx.fold is None:
                raise ValueError("det_linear backward: weight requires grad but fold is None")
            step = ctx.fold.take(ctx.rows, (x, dy), stage_copy=copy_pieces)
            dw_fold(step, ctx.fold.main_grad)
        return dx, None, None, None


def det_linear(x: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
               fold: CanonicalFold | None) -> torch.Tensor:
    """Batch-invariant ``x @ weight.T`` (bf16 in/out, fp32 accumulate); dW by the canonical fold."""
    check_linear(x, weight, rows)
    rt.check_tensor("det_linear x", x)
    rt.check_tensor("det_linear weight", weight)
    require_fold(fold, weight, "det_linear")
    return run_function(DetLinearFn, x.contiguous(), weight.contiguous(), rows, fold)
