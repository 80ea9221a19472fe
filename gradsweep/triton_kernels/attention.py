"""Batch-invariant causal attention with grouped-query heads (per sample, KV cache across calls): forward, dQ,
and dK / dV folded over canonical query tiles.

Why each piece looks the way it does:
- **Key blocks** of ``bn`` keys are aligned to absolute position 0 of a sample and folded in increasing order
  with an online softmax, so full prefill, chunked prefill and decode fold the same blocks in the same order.
  A block wholly visible to every row of a program runs the unmasked loop; the others the masked loop, whose
  arithmetic for a row that sees the whole block is the same, op for op (``where`` selects the score itself,
  every product-sum is an explicit ``fma``), so which loop serves a row never changes its bits. A block after
  a row's position keeps its state by a select (an exact no-op).
- **Launch configuration pinned** (``AttnConfig``, a function of nothing a layout can change): the row sum of p
  is a ``tl.sum`` whose order follows the block's register layout, the same for every row of every program of
  the one compiled forward kernel. Prefill programs hold ``bm`` consecutive tokens of one query head; decode
  programs hold the ``group`` query heads of a few tokens that share one K/V head (each K/V block read once
  for the group). Both are rows of the same kernel; ``tl.dot`` rows do not depend on the other rows of a tile.
- **Plans** (``_Plan``): a call's rows become runs (consecutive rows of one sample at consecutive positions)
  and programs, in vectorised numpy over the row identity once, cached per ``RowIdentity`` object: the layers
  of one step reuse them, and a call does no host work proportional to its tokens. A call is launches only
  (capturable in a CUDA graph once its plan exists).
- **Logical stores**: K / V of every call live at token = start of sample + position, so later calls' queries
  see earlier calls' keys. One call that holds every token in logical order is its own store (no copy);
  otherwise rows are scattered into store buffers. Q, dO, lse and delta are kept the same way for the fold.
- **dK / dV** cannot be returned per call (later queries add to them). Once every token of the step has had its
  backward, one launch folds them: a program per (key block, K/V head) loads the FP32 accumulator (the main
  grad, or zero), adds the canonical query tiles of its sample (``tile`` queries aligned to the sample's start,
  in order) for each query head of its group in head order, and stores it. Its inputs are logical stores, the
  same in every layout, and nothing else varies: any split of the calls and any order of their backwards
  (reverse, interleaved) give the same bits. No atomics.
- **Hostile rows**: pads and fillers (sample < 0) are in no program and no store; every load that could reach a
  row or key it must not use is masked, never multiplied by zero. A masked key adds 0 * v to a row, whose sign
  depends on whether its slot was written yet; such signed zeros can only change the sign of an exact-zero
  result, so o and dq are stored through ``where(x == 0, +0, x)``: their bits never depend on it.
- **Portable bits**: under the interpreter ``tl.dot`` would go through numpy's matmul (the host BLAS, whose
  order varies with the CPU and the row's position); every product goes through ``_common.mma``, a fixed-order
  FP32 sum there and ``tl.dot`` on the GPU.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep import attention_host as host
from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels._common import INTERPRET, FastLaunch, cdiv, mma, pow2, to_out

LOG2E = host.LOG2E


@dataclass(frozen=True)
class AttnConfig:
    """Pinned launch configuration. Bits depend on bn, bm and fwd_warps (forward row sums), dq_bn, dq_bm and
    dq_warps (delta), tile and fp32_grads (the fold); speed on the rest. ``split`` and ``rowsum_dot`` choose code
    shapes that give each row the same arithmetic either way (switchable: the GPU tests compare both).

    ``fp32_grads`` (default): dK / dV are FP32-class (~2e-6, the contract's class for them, as for every main-grad
    style accumulator): P and dS enter their products as hi + lo bf16 pairs and the fold's delta is FP32, for two
    more products per query tile in the fold and one row sum per key block in dQ. Off, with bf16 P and dS operands
    as FlashAttention, they are bf16-class (~2e-3)."""

    bm: int = 128        # forward rows per program (tokens x query heads)
    bn: int = 64         # forward key block (aligned to position 0)
    fwd_warps: int = 8
    fwd_stages: int = 3
    dq_bm: int = 128     # dQ rows per program
    dq_bn: int = 64      # dQ key block
    dq_warps: int = 8
    dq_stages: int = 2
    kv_bn: int = 128     # keys per dK / dV program
    tile: int = 32       # canonical query tile of the dK / dV fold
    kv_warps: int = 8
    kv_stages: int = 2
    split: bool = True        # unmasked loop over wholly visible blocks, masked loop over the rest
    rowsum_dot: bool = False  # row sum of p through the tensor core (dot with ones) instead of tl.sum
    fp32_grads: bool = True   # dK / dV to FP32 accuracy: P and dS enter their products as hi + lo bf16 pairs,
    #                           and the fold's delta is rowsum(P * dP) in FP32 (not rowsum(o * dO), o in bf16)


GPU_CONFIG = AttnConfig()
# Smaller blocks under the interpreter: test samples still span several key blocks, programs and tiles (its cost
# is per operation, so larger blocks than these make CI slower only through longer samples).
INTERPRET_CONFIG = AttnConfig(bm=64, bn=32, fwd_warps=4, fwd_stages=1, dq_bm=64, dq_bn=32, dq_warps=4,
                              dq_stages=1, kv_bn=32, tile=32, kv_warps=4, kv_stages=1)
DEFAULT_CONFIG = INTERPRET_CONFIG if INTERPRET else GPU_CONFIG
TILE = DEFAULT_CONFIG.tile


# ----------------------------------------------------------------------------------------------- jit helpers
# Loops: tl.range with pipelining on the GPU; under the interpreter (PORTABLE) a while loop, because it cannot
# range() over a runtime bound. Both drive the same step function.


@triton.jit
def _bf16(x, PORTABLE: tl.constexpr):
    """FP32 -> bf16 operand with round-to-nearest-even; under the interpreter kept in FP32 storage (its own cast
    truncates; int64 lanes because it checks every int32 add for overflow)."""
    if PORTABLE:
        b = x.to(tl.uint32, bitcast=True).to(tl.int64)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.to(tl.uint32).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _split(x, PORTABLE: tl.constexpr):
    """x = hi + lo to 16 significant bits, both bf16 operands (hi rounded to nearest, lo the rounded residual)."""
    hi = _bf16(x, PORTABLE)
    return hi, _bf16(x - hi.to(tl.float32), PORTABLE)


@triton.jit
def _operand(x, PORTABLE: tl.constexpr):
    """A loaded bf16 tile as a dot operand (FP32 under the interpreter, whose bf16 arithmetic is unreliable)."""
    if PORTABLE:
        return x.to(tl.float32)
    else:
        return x


@triton.jit
def _plus_zero(x):
    """-0 -> +0, every other value unchanged (a select: ``x + 0.0`` could be contracted away)."""
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def _load_rows(ptr, off, rmask, DMASK: tl.constexpr, dmask):
    """A [rows, DP] tile, masked on rows (and on the head-dim padding when DP > D)."""
    if DMASK:
        return tl.load(ptr + off, mask=rmask & dmask, other=0.0)
    else:
        return tl.load(ptr + off, mask=rmask, other=0.0)


@triton.jit
def _load_keys(ptr, off, kmask, dmask, MASK: tl.constexpr, DMASK: tl.constexpr):
    """A [keys, DP] block: masked to written keys in a masked step; unmasked (all keys exist) otherwise."""
    if MASK:
        if DMASK:
            return tl.load(ptr + off, mask=kmask & dmask, other=0.0)
        else:
            return tl.load(ptr + off, mask=kmask, other=0.0)
    else:
        if DMASK:
            return tl.load(ptr + off, mask=dmask, other=0.0)
        else:
            return tl.load(ptr + off)


@triton.jit
def _program_rows(prog_ptr, pid, hb, pack, G: tl.constexpr, BM: tl.constexpr):
    """Rows of a program: (physical row, logical token, position, query head, live) per slot, and the scalars.

    A program row r is token r // pack, query head hb * pack + r % pack: pack = 1 for prefill programs (hb is the
    query head), pack = G for decode programs (hb is the K/V head, rows are its group's query heads).
    """
    row0 = tl.load(prog_ptr + pid * 4).to(tl.int64)
    tok0 = tl.load(prog_ptr + pid * 4 + 1).to(tl.int64)
    pos0 = tl.load(prog_ptr + pid * 4 + 2).to(tl.int64)
    cnt = tl.load(prog_ptr + pid * 4 + 3).to(tl.int64)
    r = tl.arange(0, BM).to(tl.int64)
    t = r // pack
    hq = hb * pack + r % pack
    live = t < cnt
    pos = tl.where(live, pos0 + t, -1)
    hk = (hb * pack) // G
    return row0 + t, tok0 + t, pos, hq, live, tok0 - pos0, pos0, pos0 + cnt - 1, hk


# --------------------------------------------------------------------------------------------------- forward
@triton.jit
def _fwd_step(q, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, m_i, l_i, acc, qk_scale, HKV,
              BN: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, MASK: tl.constexpr, ROWSUM_DOT: tl.constexpr,
              PORTABLE: tl.constexpr):
    """Fold key block [n0, n0 + BN) into (m, l, acc). MASK=False: every key is visible to every row."""
    j = tl.arange(0, BN)
    d = tl.arange(0, DP)
    off = ((kv_tok + n0 + j) * HKV + hk)[:, None] * D + d[None, :]
    kmask = (j <= pmax - n0)[:, None]
    dmask = (d < D)[None, :]
    k = _operand(_load_keys(k_ptr, off, kmask, dmask, MASK, DP != D), PORTABLE)
    v = _operand(_load_keys(v_ptr, off, kmask, dmask, MASK, DP != D), PORTABLE)
    s = mma(q, tl.trans(k), None)
    if MASK:
        rel = pos - n0  # key j of the block is visible to a row iff j <= rel
        s = tl.where(j[None, :] <= rel[:, None], s, float("-inf"))
        active = rel >= 0
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)  # max is exact in any order; scale > 0 is monotone
        m_use = tl.where(active, m_new, 0.0)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        m_use = m_new
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(tl.fma(s, qk_scale, -m_use[:, None]))
    pb = _bf16(p, PORTABLE)
    if ROWSUM_DOT:
        ones = tl.full((BN, 16), 1.0, tl.float32 if PORTABLE else tl.bfloat16)
        rs = tl.max(mma(pb, ones, None), 1)  # every column holds the row sum
    else:
        rs = tl.sum(p, 1)
    l_new = tl.fma(l_i, alpha, rs)
    acc_new = mma(pb, v, acc * alpha[:, None])
    if MASK:
        return (tl.where(active, m_new, m_i), tl.where(active, l_new, l_i),
                tl.where(active[:, None], acc_new, acc))
    else:
        return m_new, l_new, acc_new


@triton.jit(do_not_specialize=["pack"])  # one binary for prefill and decode programs
def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, prog_ptr, pack, HQ, HKV, T, qk_scale,
                G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                STAGES: tl.constexpr, SPLIT: tl.constexpr, ROWSUM_DOT: tl.constexpr, PORTABLE: tl.constexpr):
    """One program: up to BM rows of one sample (see ``_program_rows``); K / V from the logical store."""
    row, tok, pos, hq, live, kv_tok, pmin, pmax, hk = _program_rows(prog_ptr, tl.program_id(1),
                                                                     tl.program_id(0), pack, G, BM)
    d = tl.arange(0, DP)
    dmask = (d < D)[None, :]
    roff = (row * HQ + hq)[:, None] * D + d[None, :]
    q = _operand(_load_rows(q_ptr, roff, live[:, None], DP != D, dmask), PORTABLE)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, DP), tl.float32)
    full_end = ((pmin + 1) // BN) * BN if SPLIT else pmin * 0  # blocks [0, full_end) are seen whole by every row
    if PORTABLE:
        n0 = full_end * 0
        while n0 < full_end:
            m_i, l_i, acc = _fwd_step(q, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, m_i, l_i, acc, qk_scale, HKV,
                                      BN, D, DP, False, ROWSUM_DOT, PORTABLE)
            n0 += BN
        while n0 <= pmax:
            m_i, l_i, acc = _fwd_step(q, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, m_i, l_i, acc, qk_scale, HKV,
                                      BN, D, DP, True, ROWSUM_DOT, PORTABLE)
            n0 += BN
    else:
        for n0 in tl.range(0, full_end, BN, num_stages=STAGES):
            m_i, l_i, acc = _fwd_step(q, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, m_i, l_i, acc, qk_scale, HKV,
                                      BN, D, DP, False, ROWSUM_DOT, PORTABLE)
        for n0 in tl.range(full_end, pmax + 1, BN, num_stages=STAGES):
            m_i, l_i, acc = _fwd_step(q, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, m_i, l_i, acc, qk_scale, HKV,
                                      BN, D, DP, True, ROWSUM_DOT, PORTABLE)
    l_safe = tl.where(live, l_i, 1.0)
    o = _plus_zero(acc / l_safe[:, None])
    tl.store(o_ptr + roff, to_out(o, o_ptr.dtype.element_ty), mask=live[:, None] & dmask)
    tl.store(lse_ptr + hq * T + tok, tl.where(live, m_i, 0.0) + tl.log2(l_safe), mask=live)


# --------------------------------------------------------------------------------------------------------- dQ
@triton.jit
def _dq_step(q, do, lse, delta, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, dq, dsum, qk_scale, HKV,
             BN: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, MASK: tl.constexpr, EXACT_DELTA: tl.constexpr,
             PORTABLE: tl.constexpr):
    """dq += dS @ K over key block [n0, n0 + BN), p recomputed from lse (a masked key gives p = 0 exactly).
    EXACT_DELTA: also dsum += rowsum(P * dP), the FP32 delta of the exact softmax (for the dK / dV fold)."""
    j = tl.arange(0, BN)
    d = tl.arange(0, DP)
    off = ((kv_tok + n0 + j) * HKV + hk)[:, None] * D + d[None, :]
    kmask = (j <= pmax - n0)[:, None]
    dmask = (d < D)[None, :]
    k = _operand(_load_keys(k_ptr, off, kmask, dmask, MASK, DP != D), PORTABLE)
    v = _operand(_load_keys(v_ptr, off, kmask, dmask, MASK, DP != D), PORTABLE)
    s = mma(q, tl.trans(k), None)
    if MASK:
        s = tl.where(j[None, :] <= (pos - n0)[:, None], s, float("-inf"))
    p = tl.exp2(tl.fma(s, qk_scale, -lse[:, None]))
    dp = mma(do, tl.trans(v), None)
    if EXACT_DELTA:
        dsum += tl.sum(p * dp, 1)
    ds = _bf16(p * (dp - delta[:, None]), PORTABLE)
    return mma(ds, k, dq), dsum


@triton.jit(do_not_specialize=["pack"])  # one binary for prefill and decode programs
def _dq_kernel(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, prog_ptr, pack, HQ, HKV, T,
               qk_scale, sm_scale, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BM: tl.constexpr,
               BN: tl.constexpr, STAGES: tl.constexpr, SPLIT: tl.constexpr, EXACT_DELTA: tl.constexpr,
               PORTABLE: tl.constexpr):
    """dQ of a program's rows over key blocks from position 0 in order, with delta = rowsum(o * do) from the
    bf16 o (as FlashAttention; dQ is a bf16 output). Stores the fold's delta at each row's token: that one, or
    with EXACT_DELTA rowsum(P * dP) summed over the same blocks (dK / dV to FP32 accuracy)."""
    row, tok, pos, hq, live, kv_tok, pmin, pmax, hk = _program_rows(prog_ptr, tl.program_id(1),
                                                                     tl.program_id(0), pack, G, BM)
    d = tl.arange(0, DP)
    dmask = (d < D)[None, :]
    roff = (row * HQ + hq)[:, None] * D + d[None, :]
    rmask = live[:, None]
    q = _operand(_load_rows(q_ptr, roff, rmask, DP != D, dmask), PORTABLE)
    do = _operand(_load_rows(do_ptr, roff, rmask, DP != D, dmask), PORTABLE)
    o = _load_rows(o_ptr, roff, rmask, DP != D, dmask).to(tl.float32)
    delta = tl.sum(o * do.to(tl.float32), 1)
    lse = tl.load(lse_ptr + hq * T + tok, mask=live, other=0.0)
    dq = tl.zeros((BM, DP), tl.float32)
    dsum = tl.zeros((BM,), tl.float32)
    full_end = ((pmin + 1) // BN) * BN if SPLIT else pmin * 0
    if PORTABLE:
        n0 = full_end * 0
        while n0 < full_end:
            dq, dsum = _dq_step(q, do, lse, delta, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, dq, dsum, qk_scale,
                                HKV, BN, D, DP, False, EXACT_DELTA, PORTABLE)
            n0 += BN
        while n0 <= pmax:
            dq, dsum = _dq_step(q, do, lse, delta, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, dq, dsum, qk_scale,
                                HKV, BN, D, DP, True, EXACT_DELTA, PORTABLE)
            n0 += BN
    else:
        for n0 in tl.range(0, full_end, BN, num_stages=STAGES):
            dq, dsum = _dq_step(q, do, lse, delta, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, dq, dsum, qk_scale,
                                HKV, BN, D, DP, False, EXACT_DELTA, PORTABLE)
        for n0 in tl.range(full_end, pmax + 1, BN, num_stages=STAGES):
            dq, dsum = _dq_step(q, do, lse, delta, k_ptr, v_ptr, kv_tok, n0, hk, pos, pmax, dq, dsum, qk_scale,
                                HKV, BN, D, DP, True, EXACT_DELTA, PORTABLE)
    tl.store(delta_ptr + hq * T + tok, _plus_zero(dsum) if EXACT_DELTA else delta, mask=live)
    tl.store(dq_ptr + roff, to_out(_plus_zero(dq * sm_scale), dq_ptr.dtype.element_ty), mask=rmask & dmask)


# -------------------------------------------------------------------------------------------------- dK / dV
@triton.jit
def _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid, L, qk_scale,
             sm_scale, HQ, T, TILE: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, MASK: tl.constexpr,
             FP32_GRADS: tl.constexpr, PORTABLE: tl.constexpr):
    """Add query tile [t0, t0 + TILE) of one query head to a key block's dK / dV (scores transposed: [keys, q])."""
    i = tl.arange(0, TILE)
    d = tl.arange(0, DP)
    qpos = t0 + i
    qvalid = qpos < L
    qtok = tok_base + qpos
    qoff = (qtok * HQ + hq)[:, None] * D + d[None, :]
    dmask = (d < D)[None, :]
    q = _operand(_load_rows(q_ptr, qoff, qvalid[:, None], DP != D, dmask), PORTABLE)
    do = _operand(_load_rows(do_ptr, qoff, qvalid[:, None], DP != D, dmask), PORTABLE)
    lse = tl.load(lse_ptr + hq * T + qtok, mask=qvalid, other=float("inf"))
    delta = tl.load(delta_ptr + hq * T + qtok, mask=qvalid, other=0.0)
    st = mma(k, tl.trans(q), None)
    if MASK:
        vis = (kpos[:, None] <= qpos[None, :]) & qvalid[None, :] & kvalid[:, None]
        st = tl.where(vis, st, float("-inf"))
    pt = tl.exp2(tl.fma(st, qk_scale, -lse[None, :]))
    dpt = mma(v, tl.trans(do), None)
    dst = pt * (dpt - delta[None, :]) * sm_scale
    if MASK:
        dst = tl.where(vis, dst, 0.0)
    if FP32_GRADS:  # hi then lo, a fixed order
        p_hi, p_lo = _split(pt, PORTABLE)
        dv = mma(p_lo, do, mma(p_hi, do, dv))
        ds_hi, ds_lo = _split(dst, PORTABLE)
        dk = mma(ds_lo, q, mma(ds_hi, q, dk))
    else:
        dv = mma(_bf16(pt, PORTABLE), do, dv)
        dk = mma(_bf16(dst, PORTABLE), q, dk)
    return dk, dv


@triton.jit
def _dkdv_kernel(k_ptr, v_ptr, q_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, work_ptr, HQ, HKV, T,
                 qk_scale, sm_scale, G: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BN: tl.constexpr,
                 TILE: tl.constexpr, STAGES: tl.constexpr, LOAD_ACC: tl.constexpr, FP32_GRADS: tl.constexpr,
                 PORTABLE: tl.constexpr):
    """One (key block, K/V head): FP32 dK / dV += the canonical query tiles of its sample, for each query head of
    the group in head order, tiles in position order. work row: token of the sample's start, first key, length."""
    hk = tl.program_id(0)
    w = tl.program_id(1)
    tok_base = tl.load(work_ptr + w * 3).to(tl.int64)
    k0 = tl.load(work_ptr + w * 3 + 1).to(tl.int64)
    L = tl.load(work_ptr + w * 3 + 2).to(tl.int64)
    j = tl.arange(0, BN)
    d = tl.arange(0, DP)
    kpos = k0 + j
    kvalid = kpos < L
    koff = ((tok_base + kpos) * HKV + hk)[:, None] * D + d[None, :]
    kmask = kvalid[:, None]
    dmask = (d < D)[None, :]
    k = _operand(_load_rows(k_ptr, koff, kmask, DP != D, dmask), PORTABLE)
    v = _operand(_load_rows(v_ptr, koff, kmask, DP != D, dmask), PORTABLE)
    if LOAD_ACC:
        dk = _load_rows(dk_ptr, koff, kmask, DP != D, dmask)
        dv = _load_rows(dv_ptr, koff, kmask, DP != D, dmask)
    else:
        dk = tl.zeros((BN, DP), tl.float32)
        dv = tl.zeros((BN, DP), tl.float32)
    t_first = (k0 // TILE) * TILE                     # first tile holding a query that sees a key of the block
    t_end = ((L + TILE - 1) // TILE) * TILE
    t_full = tl.minimum(((k0 + BN - 1 + TILE - 1) // TILE) * TILE, t_end)  # from here a tile sees every key
    t_tail = (L // TILE) * TILE                      # a partial last tile runs masked (its slots past L)
    t_mid_end = tl.maximum(t_full, t_tail)
    for g in range(G):  # query heads of the group, in order (a constexpr loop)
        hq = hk * G + g
        if PORTABLE:
            t0 = t_first
            while t0 < t_full:
                dk, dv = _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid,
                                  L, qk_scale, sm_scale, HQ, T, TILE, D, DP, True, FP32_GRADS, PORTABLE)
                t0 += TILE
            while t0 < t_mid_end:
                dk, dv = _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid,
                                  L, qk_scale, sm_scale, HQ, T, TILE, D, DP, False, FP32_GRADS, PORTABLE)
                t0 += TILE
            while t0 < t_end:
                dk, dv = _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid,
                                  L, qk_scale, sm_scale, HQ, T, TILE, D, DP, True, FP32_GRADS, PORTABLE)
                t0 += TILE
        else:
            for t0 in tl.range(t_first, t_full, TILE, num_stages=STAGES):
                dk, dv = _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid,
                                  L, qk_scale, sm_scale, HQ, T, TILE, D, DP, True, FP32_GRADS, PORTABLE)
            for t0 in tl.range(t_full, t_mid_end, TILE, num_stages=STAGES):
                dk, dv = _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid,
                                  L, qk_scale, sm_scale, HQ, T, TILE, D, DP, False, FP32_GRADS, PORTABLE)
            for t0 in tl.range(t_mid_end, t_end, TILE, num_stages=STAGES):
                dk, dv = _kv_step(k, v, dk, dv, q_ptr, do_ptr, lse_ptr, delta_ptr, tok_base, t0, hq, kpos, kvalid,
                                  L, qk_scale, sm_scale, HQ, T, TILE, D, DP, True, FP32_GRADS, PORTABLE)
    smask = kmask & dmask
    tl.store(dk_ptr + koff, dk, mask=smask)
    tl.store(dv_ptr + koff, dv, mask=smask)


# -------------------------------------------------------------------------------------------------- scatter
@triton.jit
def _scatter_kernel(src_a, dst_a, src_b, dst_b, rows_ptr, toks_ptr, n, ROW: tl.constexpr, ROWP: tl.constexpr,
                    BR: tl.constexpr, TWO: tl.constexpr):
    """dst[toks[i]] = src[rows[i]] for BR rows of ROW elements (and the same for a second pair): store writes."""
    i = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    live = i < n
    r = tl.load(rows_ptr + i, mask=live, other=0).to(tl.int64)
    t = tl.load(toks_ptr + i, mask=live, other=0).to(tl.int64)
    c = tl.arange(0, ROWP)
    m = live[:, None] & (c < ROW)[None, :]
    tl.store(dst_a + t[:, None] * ROW + c[None, :], tl.load(src_a + r[:, None] * ROW + c[None, :], mask=m), mask=m)
    if TWO:
        tl.store(dst_b + t[:, None] * ROW + c[None, :], tl.load(src_b + r[:, None] * ROW + c[None, :], mask=m),
                 mask=m)


# ------------------------------------------------------------------------------------------------- host side
@dataclass(frozen=True)
class _Programs:
    """Programs of one kernel for one call: prefill programs (one query head each) and decode programs (a group)."""

    single: torch.Tensor   # int32 [n, 4]: first row, first token, first position, tokens (<= bm)
    packed: torch.Tensor   # int32 [m, 4]: the same, tokens * group <= bm


def _programs(row0: np.ndarray, tok0: np.ndarray, pos0: np.ndarray, n: np.ndarray, bm: int, group: int,
              device: torch.device) -> _Programs:
    """Split runs into programs of bm tokens; a run's last piece whose group x tokens fit bm rows is packed."""
    table = host.chunk_runs(row0, tok0, pos0, n, bm)
    cnt = table[:, 3]
    packed = (cnt * group <= bm) if group > 1 else np.zeros(len(cnt), dtype=bool)
    return _Programs(*host.program_tables(table, packed, device))


@dataclass(frozen=True)
class _Plan:
    """Everything about one call's rows that does not depend on the data: runs, programs, scatter indices."""

    n_rows: int
    n_real: int
    has_pads: bool
    full: bool                 # the rows are every token of the step in logical order (the call is its own store)
    run_sample: np.ndarray     # per run (consecutive rows, one sample, consecutive positions)
    run_pos0: np.ndarray
    run_len: np.ndarray
    chain_sample: np.ndarray   # per sample of the call: its first position and the end of its last run
    chain_first: np.ndarray
    chain_end: np.ndarray
    fwd: _Programs
    dq: _Programs
    rows: torch.Tensor         # int32 [n_real]: physical row of each real row (run order)
    toks: torch.Tensor         # int32 [n_real]: its logical token


_PLANS: OrderedDict = OrderedDict()


def _build_plan(rows: RowIdentity, lengths: np.ndarray, starts: np.ndarray, cfg: AttnConfig, group: int,
                device: torch.device) -> _Plan:
    sample = rows.sample.cpu().numpy()
    position = rows.position.cpu().numpy()
    n_rows = len(sample)
    if n_rows == 0:
        z = np.zeros(0, dtype=np.int64)
        return _Plan(0, 0, False, False, z, z, z, z, z, z, _programs(z, z, z, z, cfg.bm, group, device),
                     _programs(z, z, z, z, cfg.dq_bm, group, device), host.upload(z, device), host.upload(z, device))
    r = host.runs(sample, position, lengths, starts)
    row_index, tok_index = r.scatter_index()
    return _Plan(n_rows, r.n_real, r.n_real < n_rows, r.full, r.s, r.p0, r.n, *r.chain,
                 _programs(r.first, r.tok0, r.p0, r.n, cfg.bm, group, device),
                 _programs(r.first, r.tok0, r.p0, r.n, cfg.dq_bm, group, device),
                 host.upload(row_index, device), host.upload(tok_index, device))


class _QueryFold(host.QueryFold):
    """The fold's state, with the step's lengths at hand."""

    def __init__(self, lengths: np.ndarray, total: int, tile: int) -> None:
        self.lengths = lengths
        super().__init__(total, tile)


_SCATTER, _FWD, _DQ, _DKDV = (FastLaunch(k) for k in (_scatter_kernel, _fwd_kernel, _dq_kernel, _dkdv_kernel))


def _scatter(plan: _Plan, *pairs: tuple[torch.Tensor, torch.Tensor]) -> None:
    """dst[token] = src[row] for every real row of the call (one launch for one or two equal-shaped pairs)."""
    if plan.n_real == 0:
        return
    (src_a, dst_a), (src_b, dst_b) = pairs[0], pairs[-1]
    row = int(np.prod(src_a.shape[1:]))
    rows_per = max(1, min(16, 8192 // pow2(row)))
    _SCATTER((cdiv(plan.n_real, rows_per),), [src_a, dst_a, src_b, dst_b, plan.rows, plan.toks, plan.n_real],
             {"ROW": row, "ROWP": pow2(row), "BR": rows_per, "TWO": len(pairs) == 2}, num_warps=4)


def _launch_rows(kernel: FastLaunch, progs: _Programs, cache: AttentionCache, args: tuple, warps: int, **const) -> None:
    """Launch a row kernel over its prefill programs (one per query head) and decode programs (one per K/V head).
    Heads are grid axis 0: CTAs go out longest program first across every head (the tables are sorted)."""
    consts = {"G": cache.group, "D": cache.head_dim, "DP": pow2(max(cache.head_dim, 16)), "PORTABLE": INTERPRET,
              **const}
    for table, pack, heads in ((progs.single, 1, cache.heads), (progs.packed, cache.group, cache.kv_heads)):
        if table.shape[0]:
            kernel((heads, table.shape[0]), [*args[:-1], table, pack, cache.heads, cache.kv_heads, cache.total,
                                             *args[-1]], consts, num_warps=warps)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity, cache: AttentionCache,
             need_grad: bool) -> tuple[torch.Tensor, _Plan]:
    cfg = cache.config
    plan, o = cache._begin_forward(rows, q, k, v, need_grad)
    qk_scale = LOG2E / math.sqrt(cache.head_dim)
    _launch_rows(_FWD, plan.fwd, cache, (q, cache.k, cache.v, o, cache.lse, (qk_scale,)), cfg.fwd_warps,
                 BM=cfg.bm, BN=cfg.bn, STAGES=cfg.fwd_stages, SPLIT=cfg.split, ROWSUM_DOT=cfg.rowsum_dot)
    return o, plan


def _backward(q: torch.Tensor, o: torch.Tensor, do: torch.Tensor, plan: _Plan, cache: AttentionCache) -> torch.Tensor:
    cfg = cache.config
    do, dq = cache._begin_backward(plan, q, o, do)
    sm_scale = 1.0 / math.sqrt(cache.head_dim)
    _launch_rows(_DQ, plan.dq, cache, (q, cache.k, cache.v, o, do, dq, cache.lse, cache.delta,
                                              (sm_scale * LOG2E, sm_scale)),
                 cfg.dq_warps, BM=cfg.dq_bm, BN=cfg.dq_bn, STAGES=cfg.dq_stages, SPLIT=cfg.split,
                 EXACT_DELTA=cfg.fp32_grads)
    cache._end_backward(plan, do)
    return dq


def _launch_dkdv(cache: AttentionCache) -> None:
    """Fold every canonical query tile into dK / dV (one launch, after the step's last backward)."""
    cfg = cache.config
    if not cache._fold_outputs():
        return
    work = host.kv_work(cache.lengths, cache.starts, cfg.kv_bn, cache.device)
    sm_scale = 1.0 / math.sqrt(cache.head_dim)
    _DKDV((cache.kv_heads, work.shape[0]),
          [cache.k, cache.v, cache.q, cache.do, cache.lse, cache.delta, cache.dk, cache.dv, work, cache.heads,
           cache.kv_heads, cache.total, sm_scale * LOG2E, sm_scale],
          {"G": cache.group, "D": cache.head_dim, "DP": pow2(max(cache.head_dim, 16)), "BN": cfg.kv_bn,
           "TILE": cfg.tile, "STAGES": cfg.kv_stages, "LOAD_ACC": cache._load_acc, "FP32_GRADS": cfg.fp32_grads,
           "PORTABLE": INTERPRET}, num_warps=cfg.kv_warps)


class AttentionCache(host.HostAttentionCache):
    """State of one layer over one step (``HostAttentionCache``: stores, dK / dV accumulators, bookkeeping) with
    the Triton family's plans and launches."""

    _plans = _PLANS
    _default_config = DEFAULT_CONFIG
    _build_plan = staticmethod(_build_plan)
    _scatter = staticmethod(_scatter)
    _launch_dkdv = staticmethod(_launch_dkdv)

    def _new_fold(self) -> host.QueryFold:
        return _QueryFold(self.lengths, self.total, self.config.tile)


_AttentionFn = host.autograd_function(_forward, _backward)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: RowIdentity,
              cache: AttentionCache) -> torch.Tensor:
    """Causal attention of one call's rows (q [R, heads, d], k / v [R, kv_heads, d], bf16) over their samples'
    keys so far: this call's and every earlier call's, through the cache.

    Differentiable wrt q; k / v gradients are folded into ``cache.dk`` / ``cache.dv`` (autograd gives None) once
    every token of the step has had its backward (``cache.finish()``). Pad and filler rows (sample < 0) output
    zeros and touch neither the store nor the gradients.
    """
    host.check_call(q, k, v, rows, cache)
    if any(t.dtype != torch.bfloat16 for t in (q, k, v)):
        raise ValueError(f"attention: q, k, v must be bfloat16, got {q.dtype}, {k.dtype}, {v.dtype}")
    return host.run_call(_AttentionFn, _forward, q, k, v, rows, cache)
