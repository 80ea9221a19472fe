"""Fused lm_head + selected-token log-prob that never materialises the [R, V] logits.

Forward: one kernel computes logits tiles [BM, BV] by a non-split-K GEMM and folds them into an
online log-sum-exp per row over a FIXED vocabulary chunk (``VCHUNK``: chunks give parallelism
for any R); a second kernel combines the chunks' (max, sum, target logit) in chunk order.  The
whole launch configuration is pinned (it depends on nothing about R): the in-tile ``tl.sum``
reduces every row in the same order whatever the batch.

Backward: the vocabulary is walked in chunks of ``BWD_VCHUNK`` columns.  Per chunk a GEMM with
an element-wise epilogue recomputes dlogits = g (onehot - exp(logit - lse)) in bf16 [S, chunk]
(peak extra memory O(R x chunk)); dhidden accumulates chunk after chunk in an fp32 buffer that
each GEMM loads (one sequential order over V, whatever the chunk size); dW rows of the chunk are
folded into ``fold.main_grad`` by the canonical fold kernel.  Rows of staged tiles (carried from an
earlier call, or split across calls) are recomputed from their staged (hidden, target, lse, g).

On Hopper both GEMMs read their operands by TMA (host descriptors; ``_fused_fwd_tma_kernel``,
``_dlogits_tma_kernel``) where the rows allow it, else through pointers: the same tiles, the same
ascending chain over K and the same epilogue (shared ``@triton.jit`` helpers), so the same bits (GPU test).

Targets outside [0, V) give logp 0 and zero gradients.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.kernel_api import check_linear_logp, logp_outputs, require_fold, run_function
from gradsweep.triton_kernels._common import (
    INTERPRET,
    FastLaunch,
    Tuner,
    cdiv,
    loop_bound,
    m_bucket,
    mma,
    tile_ids,
    to_out,
)
from gradsweep.triton_kernels.gemm import (
    TILE,
    TensorDescriptor,
    dw_fold_tiles,
    k_loop,
    matmul_accumulate,
    mm_configs,
    tma_rows_ok,
)
from gradsweep.triton_kernels.stage_copy import copy_pieces

__all__ = ["TILE", "linear_logp"]
# Pinned forward configuration (a row's log-sum-exp order follows it): never a function of R.
# GPU: BV=256 measured 8.75 ms vs 10.14 ms for BV=128 (H200, R=4096, V=151936, first pass). GROUP_M orders the
# (row tile, chunk) programs in groups of 8 row tiles, as a GEMM's tiles: all row tiles of one chunk at once (the
# order before) overflowed L2 at R=16384 (1.127x -> 1.047x one cuBLAS GEMM there; notes/triton_gemm_vocab.md,
# "Fifteenth session"). The order does not touch a row's arithmetic: the same bits.
FWD_CFG = ({"BM": 128, "BV": 128, "BK": 64, "VCHUNK": 256, "GROUP_M": 4, "num_warps": 4, "num_stages": 1}
           if INTERPRET else
           {"BM": 128, "BV": 256, "BK": 64, "VCHUNK": 2048, "GROUP_M": 8, "num_warps": 8, "num_stages": 3})
# Backward vocabulary chunk: extra memory O(R x BWD_VCHUNK); the bits do not follow it.
BWD_VCHUNK = 128 if INTERPRET else 8192
_CPU_DLOG = {"BM": 64, "BN": 128, "BK": 32, "GROUP_M": 4}
_COMBINE_ROWS = 128


@triton.jit
def _lse_block(acc, rv, V, t, m, s, xt):
    """One logits block (columns ``rv``; those past V are -inf) folded into its rows' running max, sum of exp and
    target logit, in one fixed order: the forward kernels' epilogue."""
    logits = tl.where(rv[None, :] < V, acc, float("-inf"))
    m_new = tl.maximum(m, tl.max(logits, 1))
    s = s * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), 1)
    xt += tl.sum(tl.where(rv[None, :] == t[:, None], acc, 0.0), 1)
    return m_new, s, xt


@triton.jit
def _store_partials(PM, PS, PT, rm, R, n_chunks, c, m, s, xt):
    """A row tile's (max, sum of exp, target logit) of vocabulary chunk c, at [row, c] of the partial arrays."""
    ok = rm < R
    off = rm.to(tl.int64) * n_chunks + c
    tl.store(PM + off, m, mask=ok)
    tl.store(PS + off, s, mask=ok)
    tl.store(PT + off, xt, mask=ok)


@triton.jit
def _fwd_program(T, R, n_chunks, BM: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """A forward program's (row tile, chunk) in grouped order, its rows (``rm``; clamped into range as ``hm`` for
    loads), the K offsets of a block, the rows' targets and the empty running (max, sum of exp, target logit): both
    forward kernels' prologue."""
    pid_m, c = tile_ids(tl.program_id(0), tl.cdiv(R, BM), n_chunks, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    hm = tl.where(rm < R, rm, 0).to(tl.int64)
    rk = tl.arange(0, BK)
    t = tl.load(T + hm)
    m = tl.full((BM,), float("-inf"), tl.float32)
    return pid_m, c, rm, hm, rk, t, m, tl.zeros((BM,), tl.float32), tl.zeros((BM,), tl.float32)


@triton.jit
def _fused_fwd_kernel(H, W, T, PM, PS, PT, R, V, K, n_chunks, s_h, s_w,
                      VCHUNK: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                      GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    """Per (row tile, vocab chunk): running max, sum of exp and target logit of the chunk's columns. Programs walk
    (row tile, chunk) in GROUP_M-row-tile groups (``tile_ids``): concurrent programs share both operands in L2."""
    _, c, rm, hm, rk, t, m, s, xt = _fwd_program(T, R, n_chunks, BM, BK, GROUP_M)
    for i in range(0, VCHUNK // BV):  # constexpr trip count; blocks past V are skipped
        vb = c * VCHUNK + i * BV
        if vb < V:
            rv = vb + tl.arange(0, BV)
            wv = tl.where(rv < V, rv, 0).to(tl.int64)
            a_ptr = H + hm[:, None] * s_h + rk[None, :]
            b_ptr = W + wv[None, :] * s_w + rk[:, None]
            acc = k_loop(a_ptr, b_ptr, tl.zeros((BM, BV), tl.float32), K, rk, 1, 1, BK, EVEN_K)
            m, s, xt = _lse_block(acc, rv, V, t, m, s, xt)
    _store_partials(PM, PS, PT, rm, R, n_chunks, c, m, s, xt)


@triton.jit
def _fused_fwd_tma_kernel(h_desc, w_desc, T, PM, PS, PT, R, V, k_tiles, n_chunks,
                          VCHUNK: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr,
                          GROUP_M: tl.constexpr):
    """``_fused_fwd_kernel`` fed by TMA (host descriptors of H [R, K] and W [V, K]): the same logits tiles in the same
    program order, each one ascending chain of BK-wide tensor-core steps over K (rows past R and columns past K load
    as zeros), the same epilogue; the GEMM family's persistent TMA kernel gives ``_mm_kernel``'s bits the same way."""
    pid_m, c, rm, _, _, t, m, s, xt = _fwd_program(T, R, n_chunks, BM, BK, GROUP_M)
    for i in range(0, VCHUNK // BV):  # constexpr trip count; blocks past V are skipped
        vb = c * VCHUNK + i * BV
        if vb < V:
            acc = tl.zeros((BM, BV), tl.float32)
            for ki in range(0, k_tiles):
                a = h_desc.load([pid_m * BM, ki * BK])
                w = w_desc.load([vb, ki * BK])
                acc = mma(a, w.T, acc)
            rv = vb + tl.arange(0, BV)
            m, s, xt = _lse_block(acc, rv, V, t, m, s, xt)
    _store_partials(PM, PS, PT, rm, R, n_chunks, c, m, s, xt)


@triton.jit
def _combine_kernel(PM, PS, PT, T, OUT, LSE, R, V, n_chunks, BR: tl.constexpr):
    """Fold the chunks' partial log-sum-exp in chunk order (element-wise over rows)."""
    rr = tl.program_id(0) * BR + tl.arange(0, BR)
    ok = rr < R
    base = rr.to(tl.int64) * n_chunks
    m = tl.full((BR,), float("-inf"), tl.float32)
    s = tl.zeros((BR,), tl.float32)
    xt = tl.zeros((BR,), tl.float32)
    for c in range(0, n_chunks):
        mc = tl.load(PM + base + c, mask=ok, other=0.0)
        sc = tl.load(PS + base + c, mask=ok, other=1.0)
        m_new = tl.maximum(m, mc)
        s = s * tl.exp(m - m_new) + sc * tl.exp(mc - m_new)
        m = m_new
        xt += tl.load(PT + base + c, mask=ok, other=0.0)
    lse = m + tl.log(s)
    t = tl.load(T + rr, mask=ok, other=0)
    valid = (t >= 0) & (t < V)
    tl.store(OUT + rr, tl.where(valid, xt - lse, 0.0), mask=ok)
    tl.store(LSE + rr, lse, mask=ok)


def fused_forward(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                  cfg: dict | None = None, tma: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp fp32 [R], lse fp32 [R]) without materialising logits.  ``cfg`` overrides FWD_CFG and ``tma`` the
    choice of the TMA kernel (benchmarks and the GPU test that compares the two kernels' bits)."""
    cfg = dict(FWD_CFG if cfg is None else cfg)
    r, k = hidden.shape
    v = weight.shape[0]
    out, lse = logp_outputs(r, v, hidden.device, "linear_logp")
    if r == 0:
        return out, lse
    n_chunks = cdiv(v, cfg["VCHUNK"])
    part = torch.empty(3, r, n_chunks, dtype=torch.float32, device=hidden.device)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    grid = (cdiv(r, cfg["BM"]) * n_chunks,)
    if _use_tma(tma, hidden, weight):
        descs = _row_descs(hidden, weight, cfg["BM"], cfg["BV"], cfg["BK"])
        _FWD_TMA(grid, [*descs, targets, part[0], part[1], part[2], r, v, loop_bound(cdiv(k, cfg["BK"])), n_chunks],
                 cfg, warps, stages)
    else:
        _FWD(grid, [hidden, weight, targets, part[0], part[1], part[2], r, v, loop_bound(k), n_chunks,
                    hidden.stride(0), weight.stride(0)], {**cfg, "EVEN_K": k % cfg["BK"] == 0}, warps, stages)
    _COMBINE((cdiv(r, _COMBINE_ROWS),), [part[0], part[1], part[2], targets, out, lse, r, v, loop_bound(n_chunks)],
             {"BR": _COMBINE_ROWS}, 4)
    return out, lse


_FWD = FastLaunch(_fused_fwd_kernel)
_FWD_TMA = FastLaunch(_fused_fwd_tma_kernel)
_COMBINE = FastLaunch(_combine_kernel)


def _use_tma(tma: bool | None, hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a GEMM of hidden against weight rows runs by TMA: ``tma`` when given (benchmarks, the tests that
    compare the two kernels), else on a Hopper-class GPU with bf16 / fp16 rows TMA can read (``tma_rows_ok``)."""
    if tma is not None:
        return tma
    return (not INTERPRET and weight.dtype == hidden.dtype and hidden.shape[1] > 0 and weight.shape[0] > 0
            and tma_rows_ok(hidden, weight))


@triton.jit
def _store_dlogits(acc, T, LSE, G, D, am, rm, rn, M, N, v0, V, s_d):
    """The dlogits kernels' epilogue: d = g (onehot(v0 + col == t) - exp(logit - lse)) stored in D's dtype (rows ``am``
    clamped into range for the loads, ``rm`` / ``rn`` masked for the store)."""
    t = tl.load(T + am)
    g = tl.load(G + am)
    g = tl.where((t >= 0) & (t < V), g, 0.0)
    lse = tl.load(LSE + am)
    hit = (v0 + rn)[None, :] == t[:, None]
    d = g[:, None] * (tl.where(hit, 1.0, 0.0) - tl.exp(acc - lse[:, None]))
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    d_ptr = D + rm.to(tl.int64)[:, None] * s_d + rn[None, :]
    tl.store(d_ptr, to_out(d, D.dtype.element_ty), mask=mask)


@triton.jit
def _dlogits_kernel(H, W, T, LSE, G, D, M, N, K, v0, V,
                    s_h, s_w, s_d,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                    EVEN_K: tl.constexpr):
    """D[M, N] = g (onehot(v0 + col == t) - exp(H @ W^T - lse)): invariant GEMM + element-wise epilogue."""
    pid_m, pid_n = tile_ids(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    am = tl.where(rm < M, rm, 0).to(tl.int64)
    bn = tl.where(rn < N, rn, 0).to(tl.int64)
    a_ptr = H + am[:, None] * s_h + rk[None, :]
    b_ptr = W + bn[None, :] * s_w + rk[:, None]
    acc = k_loop(a_ptr, b_ptr, tl.zeros((BM, BN), dtype=tl.float32), K, rk, 1, 1, BK, EVEN_K)
    _store_dlogits(acc, T, LSE, G, D, am, rm, rn, M, N, v0, V, s_d)


@triton.jit
def _dlogits_tma_kernel(h_desc, w_desc, T, LSE, G, D, M, N, k_tiles, v0, V, s_d,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
    """``_dlogits_kernel`` fed by TMA (host descriptors of H [M, K] and the chunk's W rows [N, K]): the same
    products in the same ascending chain over K blocks (out-of-range rows and K columns load as zeros), the same
    epilogue, so the same bits."""
    pid_m, pid_n = tile_ids(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for ki in range(0, k_tiles):
        a = h_desc.load([pid_m * BM, ki * BK])
        w = w_desc.load([pid_n * BN, ki * BK])
        acc = mma(a, w.T, acc)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    am = tl.where(rm < M, rm, 0).to(tl.int64)
    _store_dlogits(acc, T, LSE, G, D, am, rm, rn, M, N, v0, V, s_d)


_DLOGITS = Tuner(_dlogits_kernel, mm_configs)
_DLOGITS_TMA = Tuner(_dlogits_tma_kernel, mm_configs)


def dlogits_chunk(hidden: torch.Tensor, w_chunk: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                  g: torch.Tensor, v0: int, vocab: int, tma: bool | None = None) -> torch.Tensor:
    """bf16 dlogits [S, chunk] of vocabulary columns v0 .. v0 + chunk - 1 (recomputed logits); ``tma`` overrides
    the choice of the TMA kernel (benchmarks, the GPU test)."""
    m, k = hidden.shape
    n = w_chunk.shape[0]
    d = torch.empty(m, n, dtype=hidden.dtype, device=hidden.device)
    if m == 0 or n == 0:
        return d
    by_tma = _use_tma(tma, hidden, w_chunk)

    def grid(meta):
        return (cdiv(m, meta["BM"]) * cdiv(n, meta["BN"]),)
    if INTERPRET:  # one pinned configuration on the CPU (the TMA kernel only where a test asks for it)
        cfg = _CPU_DLOG
        if by_tma:
            descs = _row_descs(hidden, w_chunk, cfg["BM"], cfg["BN"], cfg["BK"])
            _dlogits_tma_kernel[grid(cfg)](*descs, targets, lse, g, d, m, n, loop_bound(cdiv(k, cfg["BK"])), v0,
                                           vocab, d.stride(0), **cfg)
        else:
            _dlogits_kernel[grid(cfg)](hidden, w_chunk, targets, lse, g, d, m, n, loop_bound(k), v0, vocab,
                                       hidden.stride(0), w_chunk.stride(0), d.stride(0), **cfg,
                                       EVEN_K=k % cfg["BK"] == 0)
    elif by_tma:
        def args_for(meta: dict) -> list:
            return [*_row_descs(hidden, w_chunk, meta["BM"], meta["BN"], meta["BK"]), targets, lse, g, d, m, n,
                    cdiv(k, meta["BK"]), v0, vocab, d.stride(0)]
        _DLOGITS_TMA((m_bucket(m), n, k, hidden.dtype), grid, None, {}, args_for=args_for)
    else:
        args = [hidden, w_chunk, targets, lse, g, d, m, n, k, v0, vocab, hidden.stride(0), w_chunk.stride(0),
                d.stride(0)]
        _DLOGITS((m_bucket(m), n, k, hidden.dtype), grid, args, {}, k_even=k)
    return d


def _row_descs(hidden: torch.Tensor, weight: torch.Tensor, bm: int, bn: int, bk: int) -> tuple:
    """Host TMA descriptors of H [R, K] and of weight rows [N, K] (the vocabulary, or one chunk of it), boxes of
    [bm, bk] and [bn, bk]: what the forward and the dlogits kernels read by TMA."""
    return (TensorDescriptor(hidden, list(hidden.shape), [hidden.stride(0), 1], [bm, bk]),
            TensorDescriptor(weight, list(weight.shape), [weight.stride(0), 1], [bn, bk]))


class LinearLogpFn(torch.autograd.Function):
    """Fused lm_head + selected logp; backward recomputes logits chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, fold):
        out, lse = fused_forward(hidden, weight, targets)
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.rows, ctx.fold = rows, fold
        return out

    @staticmethod
    def backward(ctx, g):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g = g.float().contiguous()
        r, k = hidden.shape
        v = weight.shape[0]
        step = None
        if need_w:
            if ctx.fold is None:
                raise ValueError("linear_logp backward: weight requires grad but fold is None")
            step = ctx.fold.take_tiles(ctx.rows, (hidden, targets, lse, g), stage_copy=copy_pieces)
            if step.num_tiles == 0:
                step = None
        # rows of staged tiles (carried from earlier calls) are recomputed from their staged (hidden, target, lse, g)
        staged = tuple(t[:step.stage_rows] for t in step.stage) if step is not None and step.staged else None
        dh_acc = torch.zeros(r, k, dtype=torch.float32, device=hidden.device) if need_h else None
        if step is not None or (need_h and r > 0):
            for v0 in range(0, v, BWD_VCHUNK):
                w_c = weight[v0:v0 + BWD_VCHUNK]
                d = dlogits_chunk(hidden, w_c, targets, lse, g, v0, v)
                if dh_acc is not None:
                    matmul_accumulate(d, w_c, dh_acc)
                if step is not None:
                    d_s = dlogits_chunk(*staged[:1], w_c, *staged[1:], v0, v) if staged is not None else d
                    dw_fold_tiles(step.desc, hidden, d, ctx.fold.main_grad[v0:v0 + w_c.shape[0]],
                                  staged[0] if staged is not None else hidden, d_s, step.host_desc)
        dh = dh_acc.to(hidden.dtype) if dh_acc is not None else None
        return dh, None, None, None, None


def linear_logp(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: RowIdentity,
                fold: CanonicalFold | None) -> torch.Tensor:
    """logp[r] = z[r, t_r] - logsumexp_v z[r, v] with z = hidden @ weight^T; fp32 [R], batch-invariant."""
    check_linear_logp(hidden, weight, targets, rows)
    require_fold(fold, weight, "linear_logp")
    targets = targets.to(device=hidden.device, dtype=torch.int64).contiguous()
    return run_function(LinearLogpFn, hidden.contiguous(), weight.contiguous(), targets, rows, fold)
