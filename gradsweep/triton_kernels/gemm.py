"""Batch-invariant GEMM (``det_linear``) with a canonical-fold dW, in Triton.

Why it is batch-invariant:
- forward and dX are non-split-K GEMMs whose reduction runs over K in one sequential loop of
  tensor-core steps; tile shapes follow M (measured on the H200: 16x32..128x256 tiles, BLOCK_K
  32..128, mma.sync and wgmma give the same row bits), the order along K never does;
- dW is a GEMM whose reduction axis is the token axis, run over the canonical token tiles of a
  ``FoldStep`` plan (rows gathered through the plan, ``-1`` rows are zeros), with its fp32
  accumulator initialised by LOADING main_grad and stored back: the same tiles in the same order
  whatever the batching, so B=N, N x B=1, chunked, padded and permuted calls give the same bits.

Under ``TRITON_INTERPRET=1`` (CPU) every launch uses one pinned configuration and upcasts the
operands of ``tl.dot`` to fp32 (the interpreter's bf16 dot is wrong); on the GPU configurations
are autotuned per (M bucket, N, K) over shapes that all keep the K order.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, FoldStep, RowIdentity
from gradsweep.triton_kernels._common import cast_out

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TILE = 64  # canonical token tile of the dW fold (the fold kernel's K block equals it)

# Pinned interpreter configuration (CPU): numpy's blocking must not vary between calls.
# Large tiles: the interpreter's cost is per program, numpy vectorises inside a tile.
_CPU_MM = {"BM": 64, "BN": 64, "BK": 32, "GROUP_M": 4}
_CPU_DW = {"BN": 64, "BK": 64, "GROUP_M": 4}


def loop_bound(n: int):
    """A kernel's runtime loop bound: a constexpr under the interpreter, a plain int on the GPU.

    The interpreter (numpy 2.4) cannot ``range()`` over a runtime scalar argument (it becomes a
    1-element array); a ``tl.constexpr`` argument stays a plain int there.
    """
    return tl.constexpr(n) if INTERPRET else n


def m_bucket(m: int) -> int:
    """Autotune key for the row count: a few buckets, so a trainer's varying R retunes rarely."""
    for b in (16, 64, 256, 1024):
        if m <= b:
            return b
    return 4096


@triton.jit
def _tile_ids(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """Grouped (swizzled) tile order: GROUP_M row tiles share each column tile in L2."""
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    return pid_m, pid_n


@triton.jit
def _mm_kernel(A, B, C, M, N, K, MB,
               s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
               ACC_IN: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    """C[M,N] (+)= A[M,K] @ B[K,N]; one sequential K loop (no split-K), fp32 accumulator.

    ACC_IN: C is an fp32 accumulator loaded before the loop (reductions chained across calls
    keep one sequential order).  MB is only an autotune key.
    """
    pid_m, pid_n = _tile_ids(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    am = tl.where(rm < M, rm, 0).to(tl.int64)  # clamp: rows past M read row 0, never stored
    bn = tl.where(rn < N, rn, 0).to(tl.int64)
    a_ptr = A + am[:, None] * s_am + rk[None, :] * s_ak
    b_ptr = B + rk[:, None] * s_bk + bn[None, :] * s_bn
    c_ptr = C + rm.to(tl.int64)[:, None] * s_cm + rn[None, :] * s_cn
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if ACC_IN:
        acc = tl.load(c_ptr, mask=c_mask, other=0.0)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        if EVEN_K:
            a = tl.load(a_ptr)
            b = tl.load(b_ptr)
        else:
            k_ok = (k0 + rk) < K
            a = tl.load(a_ptr, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptr, mask=k_ok[:, None], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc)
        a_ptr += BK * s_ak
        b_ptr += BK * s_bk
    tl.store(c_ptr, cast_out(acc, C.dtype.element_ty, UPCAST), mask=c_mask)


def _mm_configs() -> list[triton.Config]:
    """Candidate tiles (small, medium, large M); BK in {64, 128}, never a split of K."""
    shapes = [  # (BM, BN, BK, warps, stages)
        (16, 32, 128, 4, 5), (16, 64, 128, 4, 4), (16, 128, 128, 4, 4),
        (64, 64, 64, 4, 5), (64, 128, 64, 4, 4), (64, 256, 64, 8, 3), (128, 64, 64, 4, 4),
        (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3),
    ]
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in shapes]


def _prune_mm(configs, named_args, **_):
    """Keep the tiles that suit the row bucket (a speed choice only: rows are tile-invariant)."""
    mb = named_args["MB"]
    small = {(16, 32), (16, 64), (16, 128)}
    mid = {(64, 64), (64, 128)}
    big = {(64, 128), (128, 128), (128, 64), (64, 256)}
    large = {(128, 256), (128, 128), (256, 128)}
    want = small if mb <= 16 else mid if mb <= 64 else big if mb <= 256 else large
    keep = [c for c in configs if (c.kwargs["BM"], c.kwargs["BN"]) in want]
    return keep or configs


_mm_tuned = triton.autotune(configs=_mm_configs(), key=["MB", "N", "K", "ACC_IN"],
                            prune_configs_by={"early_config_prune": _prune_mm},
                            restore_value=["C"], warmup=5, rep=25)(_mm_kernel)


def _launch_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, acc_in: bool) -> torch.Tensor:
    """out = (out if acc_in) + a @ b with a [M,K], b [K,N] (any strides), out [M,N]."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out if acc_in else out.zero_()
    args = (a, b, out, m, n, loop_bound(k), m_bucket(m), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            out.stride(0), out.stride(1))
    if INTERPRET:
        cfg = _CPU_MM
        grid = (triton.cdiv(m, cfg["BM"]) * triton.cdiv(n, cfg["BN"]),)
        _mm_kernel[grid](*args, **cfg, ACC_IN=acc_in, EVEN_K=k % cfg["BK"] == 0, UPCAST=True)
    else:
        even = k % 128 == 0  # every candidate BK divides 128

        def grid(meta):
            return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)
        _mm_tuned[grid](*args, ACC_IN=acc_in, EVEN_K=even, UPCAST=False)
    return out


def matmul_invariant(a: torch.Tensor, b_t: torch.Tensor,
                     out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a @ b_t.T (b_t is [N, K], weight layout; any strides), fp32 accumulate, one K order for every M."""
    if a.dim() != 2 or b_t.dim() != 2 or a.shape[1] != b_t.shape[1]:
        raise ValueError(f"matmul_invariant: shapes {tuple(a.shape)} x {tuple(b_t.shape)}^T do not match")
    out = torch.empty(a.shape[0], b_t.shape[0], dtype=out_dtype or a.dtype, device=a.device)
    return _launch_mm(a, b_t.t(), out, acc_in=False)


def matmul_accumulate(a: torch.Tensor, b: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
    """acc[M,N] (fp32) += a[M,K] @ b[K,N], the accumulator loaded into the GEMM (chains keep one order)."""
    if acc.dtype != torch.float32 or acc.shape != (a.shape[0], b.shape[1]):
        raise ValueError("matmul_accumulate: acc must be fp32 [M, N]")
    return _launch_mm(a, b, acc, acc_in=True)


@triton.jit
def _dw_kernel(PLAN, X, DY, G, n_tiles, N, K,
               s_x, s_dy, s_g,
               BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, GROUP_M: tl.constexpr,
               UPCAST: tl.constexpr):
    """G[N,K] (fp32, loaded first) += sum over plan tiles, in order, of DY[rows]^T @ X[rows].

    The reduction axis is the token axis: one canonical tile (BT tokens) per iteration, no split.
    """
    pid_n, pid_k = _tile_ids(tl.program_id(0), tl.cdiv(N, BN), tl.cdiv(K, BK), GROUP_M)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_k * BK + tl.arange(0, BK)
    rt = tl.arange(0, BT)
    n_ok = rn < N
    k_ok = rk < K
    g_ptr = G + rn.to(tl.int64)[:, None] * s_g + rk[None, :]
    g_mask = n_ok[:, None] & k_ok[None, :]
    acc = tl.load(g_ptr, mask=g_mask, other=0.0)  # main grad loaded BEFORE the fold
    for t in range(0, n_tiles):
        idx = tl.load(PLAN + t * BT + rt)
        live = idx >= 0
        row = tl.where(live, idx, 0).to(tl.int64)
        dy = tl.load(DY + row[:, None] * s_dy + rn[None, :], mask=live[:, None] & n_ok[None, :], other=0.0)
        x = tl.load(X + row[:, None] * s_x + rk[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
        if UPCAST:
            dy = dy.to(tl.float32)
            x = x.to(tl.float32)
        acc = tl.dot(tl.trans(dy), x, acc)
    tl.store(g_ptr, acc, mask=g_mask)


def _dw_configs() -> list[triton.Config]:
    shapes = [(128, 128, 8, 4), (128, 256, 8, 3), (256, 128, 8, 3)]
    return [triton.Config({"BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bn, bk, w, s in shapes]


_dw_tuned = triton.autotune(configs=_dw_configs(), key=["N", "K"], restore_value=["G"],
                            warmup=5, rep=25)(_dw_kernel)


def dw_fold(step: FoldStep, main_grad: torch.Tensor, x_index: int = 0, dy_index: int = 1) -> torch.Tensor:
    """Fold the step's canonical tiles of dY^T X into fp32 ``main_grad`` [N, K] (in place).

    ``step.tensors[x_index]`` is X [S, K] and ``step.tensors[dy_index]`` is dY [S, N]; rows are
    read through ``step.plan``.  The kernel loads main_grad, folds tile after tile, stores it.
    """
    x = step.tensors[x_index].contiguous()
    dy = step.tensors[dy_index].contiguous()
    return dw_fold_raw(step.plan, x, dy, main_grad)


def dw_fold_raw(plan: torch.Tensor, x: torch.Tensor, dy: torch.Tensor,
                main_grad: torch.Tensor) -> torch.Tensor:
    """The fold kernel on explicit tensors (plan [n_tiles, tile] int32; main_grad may be a row slice)."""
    n, k = main_grad.shape
    if main_grad.dtype != torch.float32 or main_grad.stride(1) != 1:
        raise ValueError("dw_fold: main_grad must be fp32 with contiguous rows")
    if x.shape[1] != k or dy.shape[1] != n or x.shape[0] != dy.shape[0]:
        raise ValueError(f"dw_fold: X {tuple(x.shape)}, dY {tuple(dy.shape)} do not fit main_grad {(n, k)}")
    n_tiles, bt = plan.shape
    if n_tiles == 0 or n == 0 or k == 0:
        return main_grad
    if bt < 16 or bt & (bt - 1):
        raise ValueError(f"dw_fold: the fold tile must be a power of two >= 16, got {bt}")
    plan = plan.to(device=x.device, dtype=torch.int32).contiguous()
    args = (plan, x, dy, main_grad, loop_bound(n_tiles), n, k, x.stride(0), dy.stride(0), main_grad.stride(0))
    if INTERPRET:
        cfg = _CPU_DW
        grid = (triton.cdiv(n, cfg["BN"]) * triton.cdiv(k, cfg["BK"]),)
        _dw_kernel[grid](*args, **cfg, BT=bt, UPCAST=True)
    else:
        def grid(meta):
            return (triton.cdiv(n, meta["BN"]) * triton.cdiv(k, meta["BK"]),)
        _dw_tuned[grid](*args, BT=bt, UPCAST=False)
    return main_grad


def _check_fold(weight: torch.Tensor, fold: CanonicalFold | None, what: str) -> None:
    if fold is None and weight.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{what}: the weight requires grad but no CanonicalFold was given; dW is only "
                         "produced by folding into fold.main_grad (pass a CanonicalFold, or detach "
                         "the weight)")
    if fold is not None and fold.main_grad.shape != weight.shape:
        raise ValueError(f"{what}: fold.main_grad {tuple(fold.main_grad.shape)} != "
                         f"weight {tuple(weight.shape)}")


class DetLinearFn(torch.autograd.Function):
    """y = x @ W^T; backward dX by the invariant GEMM, dW folded into fold.main_grad (grad None)."""

    @staticmethod
    def forward(ctx, x, weight, rows, fold):
        ctx.save_for_backward(x, weight)
        ctx.rows, ctx.fold = rows, fold
        return matmul_invariant(x, weight)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        dx = matmul_invariant(dy, weight.t()) if ctx.needs_input_grad[0] else None
        if ctx.needs_input_grad[1]:
            if ctx.fold is None:
                raise ValueError("det_linear backward: weight requires grad but fold is None")
            step = ctx.fold.take(ctx.rows, (x, dy))
            dw_fold(step, ctx.fold.main_grad)
        return dx, None, None, None


def det_linear(x: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
               fold: CanonicalFold | None) -> torch.Tensor:
    """Batch-invariant ``x @ weight.T`` (bf16 in/out, fp32 accumulate); dW by the canonical fold."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"det_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not match")
    if rows.num_rows != x.shape[0]:
        raise ValueError(f"det_linear: {rows.num_rows} row identities for {x.shape[0]} rows")
    _check_fold(weight, fold, "det_linear")
    return DetLinearFn.apply(x.contiguous(), weight.contiguous(), rows, fold)
