"""Batch-invariant GEMM (``det_linear``) with a canonical-fold dW, in Triton.

Why it is batch-invariant:
- forward and dX are non-split-K GEMMs whose reduction runs over K in one sequential loop of
  tensor-core steps; tile shapes follow M (measured on the H200: 16x32..128x256 tiles, BLOCK_K
  32..128, mma.sync and wgmma give the same row bits), the order along K never does;
- dW is a GEMM whose reduction axis is the token axis, run over the canonical token tiles of a
  ``TileStep`` (tile descriptors: rows read in place or from the fold's staging rows, absent rows are
  zeros), with its fp32
  accumulator initialised by LOADING main_grad and stored back: the same tiles in the same order
  whatever the batching, so B=N, N x B=1, chunked, padded and permuted calls give the same bits.

Speed (measured on the H200, notes/triton_gemm_vocab.md):
- the operand that is contiguous along N (W in dX, W chunks in linear_logp's dhidden) is indexed
  ``rn % N`` with contiguity hints when N % 8 == 0, so its loads stay 16-byte async copies (a
  ``where`` clamp there made them 2-byte loads and spilled);
- the dW fold prefetches the next tile's descriptor one iteration ahead, so the gather loads
  are software-pipelined like a plain GEMM (an index load in the same iteration left 2 buffers
  and a wait-all per step);
- launches skip ``triton.autotune``: a config is tuned once per key (``_common.Tuner``), then the
  compiled kernel is called directly, keyed by everything Triton specialises on.

The forward at M >= 1024 (weight [N, K] contiguous, bf16, TMA-aligned) runs a persistent, TMA-fed kernel
(``_mm_tma_kernel``): the same ascending chain of BK-wide tensor-core steps per output tile, so its rows are bit
for bit those of ``_mm_kernel`` (measured on the H200 for six tile configurations and M = 1 .. 16384,
bench/results/tma_gemm_h200.json); it runs at cuBLAS speed there, while small M keeps ``_mm_kernel``.

The K loop of every GEMM of the family (``k_loop``: this module's forward / dX and linear_logp's logits
tiles) is written once. Under ``TRITON_INTERPRET=1`` (CPU) every launch uses one pinned configuration and
every product goes through ``_common.mma``: a fixed-order FP32 product that never reaches the host BLAS
(whose kernel, chosen by the CPU, makes a row's bits depend on its position in the block); on the GPU
``mma`` is ``tl.dot``.
"""

from __future__ import annotations

import itertools
import os

import numpy as np
import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (triton >= 3.4); without them every launch uses _mm_kernel
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton
    TensorDescriptor = None
try:  # Triton's per-thread global-scratch allocator state (_ensure_allocator)
    from triton.runtime import _allocation
except ImportError:  # pragma: no cover - older triton
    _allocation = None

from gradsweep.canonical import CanonicalFold, RowIdentity, TileStep
from gradsweep.kernel_api import check_linear, require_fold, run_function
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
from gradsweep.triton_kernels.stage_copy import copy_pieces

TILE = 64  # canonical token tile of the dW fold (the fold kernel's K block equals it)

# Pinned interpreter configuration (CPU): numpy's blocking must not vary between calls.
# Large tiles: the interpreter's cost is per program, numpy vectorises inside a tile.
_CPU_MM = {"BM": 64, "BN": 64, "BK": 32, "GROUP_M": 4}
_CPU_DW = {"BN": 64, "BK": 64, "GROUP_M": 4}


@triton.jit
def k_loop(a_ptr, b_ptr, acc, K, rk, s_ak, s_bk, BK: tl.constexpr, EVEN_K: tl.constexpr):
    """acc + A @ B over K in one sequential chain of BK-wide products (never split): the GEMM loop of the family.

    ``a_ptr`` [BM, BK] and ``b_ptr`` [BK, BN] point at the first K block (``rk`` = arange(BK) along K) and move
    by BK x their K stride each step; EVEN_K (BK divides K) loads unmasked, else the K tail is masked to zero.
    """
    for k0 in range(0, K, BK):
        if EVEN_K:
            a = tl.load(a_ptr)
            b = tl.load(b_ptr)
        else:
            k_ok = (k0 + rk) < K
            a = tl.load(a_ptr, mask=k_ok[None, :], other=0.0)
            b = tl.load(b_ptr, mask=k_ok[:, None], other=0.0)
        acc = mma(a, b, acc)
        a_ptr += BK * s_ak
        b_ptr += BK * s_bk
    return acc


@triton.jit
def _mm_kernel(A, B, C, M, N, K,
               s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
               ACC_IN: tl.constexpr, EVEN_K: tl.constexpr, HINT_N: tl.constexpr):
    """C[M,N] (+)= A[M,K] @ B[K,N]; one sequential K loop (no split-K), fp32 accumulator.

    ACC_IN: C is an fp32 accumulator loaded before the loop (reductions chained across calls
    keep one sequential order).  Rows and columns past M / N wrap around (``% M``, ``% N``):
    they read valid memory and are never stored.  HINT_N (B contiguous along N and N % 8 == 0):
    every aligned group of 8 wrapped columns is still contiguous, so the hint lets the loads of B
    be 16-byte async copies.
    """
    pid_m, pid_n = tile_ids(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    am = (rm % M).to(tl.int64)
    bn = rn % N
    if HINT_N:
        bn = tl.max_contiguous(tl.multiple_of(bn, BN), BN)
    a_ptr = A + am[:, None] * s_am + rk[None, :] * s_ak
    b_ptr = B + rk[:, None] * s_bk + bn.to(tl.int64)[None, :] * s_bn
    c_ptr = C + rm.to(tl.int64)[:, None] * s_cm + rn[None, :] * s_cn
    c_mask = (rm[:, None] < M) & (rn[None, :] < N)
    if ACC_IN:
        acc = tl.load(c_ptr, mask=c_mask, other=0.0)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    acc = k_loop(a_ptr, b_ptr, acc, K, rk, s_ak, s_bk, BK, EVEN_K)
    tl.store(c_ptr, to_out(acc, C.dtype.element_ty), mask=c_mask)


# (BM, BN, BK, warps, stages) per row bucket: a speed choice only (rows are tile-invariant).
_MM_SHAPES = {
    16: [(16, 32, 128, 4, 5), (16, 64, 128, 4, 4), (16, 32, 256, 4, 3), (32, 64, 128, 4, 4),
         (16, 128, 128, 4, 4)],
    64: [(64, 64, 64, 4, 5), (64, 128, 64, 4, 4), (64, 64, 128, 4, 4), (32, 64, 128, 4, 4)],
    256: [(64, 128, 64, 4, 4), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (64, 256, 64, 8, 3),
          (64, 64, 128, 4, 4)],
    1024: [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4)],
    4096: [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 4), (256, 128, 64, 8, 3)],
}


def mm_configs(key: tuple) -> list[triton.Config]:
    """Candidates for a (row bucket, ...) key: BK in {64, 128, 256}, never a split of K."""
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in _MM_SHAPES[key[0]]]


_MM = Tuner(_mm_kernel, mm_configs)

# Small M on a Hopper-class GPU runs swapped: C^T[N, M] = B^T[N, K] @ A^T[K, M] through the same kernel, so the
# weight's rows fill a 64- or 128-row tile (every load in bounds, one wgmma-sized tile) and the few token rows are
# a 16- or 32-column tile (they wrap modulo M like any tile tail: never stored). The CUDA family's swapped CUTLASS
# GEMM took M = 1 / 16 from 1.9-2.0x to 1.0x cuBLAS (notes/kernels_cuda.md, "Twentieth session"). An output
# element still gets one tl.dot chain over K in ascending BK blocks with the same two factors per product: the
# swap moves no bit (checked on the GPU by tests/test_triton_gemm_swap.py against the unswapped launch and the
# TMA kernel's rows). A speed choice: GRADSWEEP_TRITON_SWAP_M sets the largest swapped M (default 32, 0: never).
# Measured on the H200 (notes/triton_gemm_vocab.md, "Twenty-first session", graph replay): M = 16 / 32 12.0 /
# 11.7 -> 8.8 / 9.6 us (cuBLAS's time), M = 1 15.2 -> 13.1, M = 64 11.8 -> 12.1 (no gain: not swapped); a long
# reduction at M = 16 (dX through a 14336- or 151936-wide weight) ran slower swapped (34 -> 38.5, 343 -> 365 us),
# so past SWAP_LONG_K only the narrowest M (<= 8, where the swap still won at K = 14336) is swapped.
SWAP_M = int(os.environ.get("GRADSWEEP_TRITON_SWAP_M", "32"))
SWAP_LONG_K = 8192


def swaps(m: int, k: int) -> bool:
    """Whether a Hopper launch of M rows with reduction K runs swapped (see ``SWAP_M``)."""
    return m <= SWAP_M and (m <= 8 or k <= SWAP_LONG_K)


def swap_bucket(m: int) -> int:
    """The swapped launch's tuning bucket of M: 1 (Triton compiles M = 1 as a constant: its own binary, and its
    best pipeline is deeper), 16 or 64."""
    return 1 if m == 1 else 16 if m <= 16 else 64


# M = 1 tunes apart (bucket 1): on the H200 (notes/triton_gemm_vocab.md, "Twenty-second session", graph replay,
# scripts/gemm_swap_configs.py) its best bucket-16 shape ran 13.0-13.3 us at N = K = 4096 against cuBLAS's 9.6, the
# deeper pipelines 11.1 (64, 16, 256, 4, 5) and 11.6 (64, 16, 128, 4, 8); at K = 14336 34.6-35.1 against 40.8;
# (128, 16, 128, 4, 4) was the fastest at N = 151936 (274 us). M = 16 keeps its list (8.1 us there, 0.86x).
_SWAP_SHAPES = {  # (BM over N, BN over M, BK, warps, stages) by the bucket of M
    1: [(64, 16, 256, 4, 5), (64, 16, 128, 4, 8), (128, 16, 128, 4, 4), (64, 16, 256, 4, 3), (128, 16, 64, 8, 5)],
    16: [(64, 16, 128, 4, 4), (64, 16, 256, 4, 3), (128, 16, 128, 4, 4), (64, 16, 64, 4, 6), (128, 16, 64, 8, 5)],
    64: [(64, 32, 128, 4, 4), (64, 64, 64, 4, 4), (128, 32, 128, 8, 4), (64, 16, 128, 4, 4), (128, 64, 64, 8, 4)],
}


def swap_configs(key: tuple) -> list[triton.Config]:
    """Candidates of the swapped small-M launch (key[0]: ``swap_bucket``)."""
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=st)
            for bm, bn, bk, w, st in _SWAP_SHAPES[key[0]]]


_MM_SWAP = Tuner(_mm_kernel, swap_configs)


@triton.jit
def _mm_tma_kernel(a_desc, w_desc, c_desc, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr, B_T: tl.constexpr):
    """C[M,N] = A[M,K] @ B[K,N]: a persistent grid (at most PROGRAMS programs, tile stride PROGRAMS) walks the
    output tiles; each tile is one sequential chain over K blocks in ascending order (no split-K), fed by TMA
    (out-of-range rows and K columns load as zeros, stores are clipped), so a row's bits are those of ``_mm_kernel``
    for every M. B_T: ``w_desc`` describes W [N, K] with B = W^T (the forward); else B [K, N] itself (dX: the
    weight [N_out, K_in] is B)."""
    n_m = tl.cdiv(M, BM)
    n_n = tl.cdiv(N, BN)
    k_tiles = tl.cdiv(K, BK)
    for t in tl.range(tl.program_id(0), n_m * n_n, PROGRAMS, flatten=True):
        pid_m, pid_n = tile_ids(t, n_m, n_n, GROUP_M)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BM, ki * BK])
            if B_T:
                w = w_desc.load([pid_n * BN, ki * BK])
                acc = mma(a, w.T, acc)
            else:
                b = w_desc.load([ki * BK, pid_n * BN])
                acc = mma(a, b, acc)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(c_desc.dtype))


# The persistent TMA kernel's tiles by row count: (least M, tiles, warps, stages), the last row whose least M <= M
# wins. Smaller output tiles fill the GPU at small M (M = 256, N = K = 4096: 128 tiles of 64 x 128 against 32 of
# 128 x 256). Kernel time by graph replay on the H200, N = K = 4096, against cuBLAS: M = 256 fwd 1.07x / dX 1.18x
# with 64 x 128 (the pointer kernel 1.37x / 1.21x; bench/results/small_m_tma_2026-12-03/); M = 512 fwd 0.98x / dX
# 1.02x with 128 x 128 (64 x 128: 1.32x / 1.29x); M = 768 and 1023 1.17x / 0.98x fwd with 128 x 256 (128 x 128:
# 1.30x / 1.08x; bench/results/mid_m_tma_2026-12-03/). Below 256 the pointer kernel stays faster. A speed choice
# only: the TMA kernel gives _mm_kernel's bits for every tile shape (one ascending chain over K).
_TMA_TILES = (
    (256, {"BM": 64, "BN": 128, "BK": 64, "GROUP_M": 8}, 4, 5),
    (512, {"BM": 128, "BN": 128, "BK": 64, "GROUP_M": 8}, 8, 4),
    (768, {"BM": 128, "BN": 256, "BK": 64, "GROUP_M": 8}, 8, 3),  # measured best at every large shape (notes)
)
TMA_MIN_M = _TMA_TILES[0][0]


def _tma_tiles(m: int) -> tuple[dict, int, int]:
    """(tiles, warps, stages) of the TMA kernel for m rows (m >= TMA_MIN_M)."""
    for least, cfg, warps, stages in reversed(_TMA_TILES):
        if m >= least:
            return cfg, warps, stages
    raise ValueError(f"the TMA GEMM takes M >= {TMA_MIN_M}, got {m}")


_TMA_DTYPES = (torch.bfloat16, torch.float16)  # an fp32 C tile would not fit in shared memory
_SMS: dict[int, int] = {}


def _tma_ok(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether the TMA kernel can take out = a @ b: a Hopper-class GPU, M >= TMA_MIN_M, a [M,K] contiguous 16-bit,
    b [K,N] a contiguous [N,K] weight seen transposed or contiguous itself, out contiguous, and TMA's rules on each
    (``_tma_rows``)."""
    # the row count first (every small-M launch asks; ``a.device`` would build a torch.device object)
    if a.shape[0] < TMA_MIN_M or INTERPRET or TensorDescriptor is None or not a.is_cuda or _capability(a) < 9:
        return False
    if a.dtype not in (torch.bfloat16, torch.float16) or b.dtype != a.dtype or out.dtype not in _TMA_DTYPES:
        return False
    rows = b.t() if b.stride(0) == 1 else b  # the weight's own rows
    return (a.is_contiguous() and rows.is_contiguous() and out.is_contiguous()
            and all(map(_tma_rows, (a, rows, out))))


def _tma_rows(t: torch.Tensor) -> bool:
    """TMA's rules for a tensor read or written as whole rows: base address and row pitch multiples of 16 bytes."""
    return t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def _launch_mm_tma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = a @ b through ``_mm_tma_kernel`` (``_tma_ok`` holds): b [K, N] a transposed weight or contiguous.

    The launch is memoised (``FastLaunch.memo``) on what its arguments are made of: the three addresses, M, N, K,
    the dtypes and which way b lies (``_tma_ok`` guarantees contiguous rows, so shapes give the strides; M gives the
    tiles); a step that calls the same GEMM on the same buffers again skips building, binding and expanding its
    three descriptors."""
    m, k = a.shape
    n = b.shape[1]
    b_t = b.stride(0) == 1

    def build() -> tuple:
        cfg, warps, stages = _tma_tiles(m)
        dev = a.device.index if a.device.index is not None else torch.cuda.current_device()
        if dev not in _SMS:
            _SMS[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
        sms = _SMS[dev]  # the tile stride of every program (one compiled kernel per device)
        a_desc = TensorDescriptor(a, [m, k], [k, 1], [cfg["BM"], cfg["BK"]])
        if b_t:
            b_desc = TensorDescriptor(b.t(), [n, k], [k, 1], [cfg["BN"], cfg["BK"]])
        else:
            b_desc = TensorDescriptor(b, [k, n], [n, 1], [cfg["BK"], cfg["BN"]])
        c_desc = TensorDescriptor(out, [m, n], [n, 1], [cfg["BM"], cfg["BN"]])
        _ensure_allocator()
        grid = (min(sms, cdiv(m, cfg["BM"]) * cdiv(n, cfg["BN"])),)
        return grid, [a_desc, b_desc, c_desc, m, n, k], {**cfg, "PROGRAMS": sms, "B_T": b_t}, warps, stages

    _MM_TMA.memo((a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, b_t, a.dtype, out.dtype), build)
    return out


_MM_TMA = FastLaunch(_mm_tma_kernel)


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """A global-scratch allocator for TMA launches when this thread has none (Triton's is per thread and
    raises when a kernel asks for scratch); one the caller set is kept."""
    if _allocation is None:  # pragma: no cover - older triton
        return
    current, null = getattr(_allocation, "_allocator", None), getattr(_allocation, "_NULL_ALLOCATOR", None)
    if current is not None and null is not None and current.get() is null:
        triton.set_allocator(_torch_scratch)


def _launch_mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, acc_in: bool) -> torch.Tensor:
    """out = (out if acc_in) + a @ b with a [M,K], b [K,N] (any strides), out [M,N]."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out if acc_in else out.zero_()
    if not acc_in and _tma_ok(a, b, out):  # b: a weight [N, K] seen as [K, N] (forward), or [K, N] itself (dX)
        return _launch_mm_tma(a, b, out)
    sa, sb, so = a.stride(), b.stride(), out.stride()
    hint = sb[1] == 1 and n % 8 == 0
    if INTERPRET:
        cfg = _CPU_MM
        grid = (cdiv(m, cfg["BM"]) * cdiv(n, cfg["BN"]),)
        _mm_kernel[grid](a, b, out, m, n, loop_bound(k), *sa, *sb, *so, **cfg, ACC_IN=acc_in,
                         EVEN_K=k % cfg["BK"] == 0, HINT_N=hint)
        return out

    if swaps(m, k) and a.is_cuda and _capability(a) >= 9:
        return _launch_mm_swapped(a, b, out, acc_in)

    def grid(meta):
        return (cdiv(m, meta["BM"]) * cdiv(n, meta["BN"]),)

    def args() -> list:
        return [a, b, out, m, n, k, *sa, *sb, *so]
    # memoised on what the arguments are made of (addresses, sizes, strides, dtypes): a small-M GEMM is host-bound
    _MM.memo((a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, sa, sb, so, a.dtype, b.dtype, out.dtype),
             (m_bucket(m), n, k, acc_in, hint, a.dtype, out.dtype, sa[1] == 1, sb[1] == 1), grid, args,
             {"ACC_IN": acc_in, "HINT_N": hint}, scratch=2 if acc_in else None, k_even=k)
    return out


def _launch_mm_swapped(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, acc_in: bool) -> torch.Tensor:
    """``_launch_mm`` at small M (``SWAP_M``), run as out^T (+)= b^T @ a^T: the kernel's rows are b's N columns, its
    columns a's M rows (strides exchanged, nothing copied); see ``SWAP_M``."""
    m, k = a.shape
    n = b.shape[1]
    sa, sb, so = a.stride(), b.stride(), out.stride()
    hint = sa[0] == 1 and m % 8 == 0  # the swapped B (a^T) contiguous along its columns: a column-major a

    def grid(meta):
        return (cdiv(n, meta["BM"]) * cdiv(m, meta["BN"]),)

    def args() -> list:
        return [b, a, out, n, m, k, sb[1], sb[0], sa[1], sa[0], so[1], so[0]]
    _MM_SWAP.memo((a.data_ptr(), b.data_ptr(), out.data_ptr(), m, n, k, sa, sb, so, a.dtype, b.dtype, out.dtype),
                  (swap_bucket(m), n, k, acc_in, hint, a.dtype, out.dtype, sa[1] == 1, sb[0] == 1), grid,
                  args, {"ACC_IN": acc_in, "HINT_N": hint}, scratch=2 if acc_in else None, k_even=k)
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
def _main_grad_tile(G, rn, rk, N, K, s_g):
    """The dW folds' output tile of the FP32 main grad: (pointers, mask, its values), LOADED before the fold so the
    fold continues the accumulator's one chain."""
    g_ptr = G + rn.to(tl.int64)[:, None] * s_g + rk[None, :]
    g_mask = (rn < N)[:, None] & (rk < K)[None, :]
    return g_ptr, g_mask, tl.load(g_ptr, mask=g_mask, other=0.0)


@triton.jit
def _tile(DESC, t):
    """Tile t's descriptor ``(row0, count)``. The dW folds load it one iteration ahead of its use: the tile loads then
    depend on a loop-carried value, not on a load of the same iteration, and are pipelined like a plain GEMM's."""
    return tl.load(DESC + 2 * t), tl.load(DESC + 2 * t + 1)


@triton.jit
def _dw_kernel(DESC, X, DY, XS, DYS, G, n_tiles, N, K,
               s_x, s_dy, s_g,
               BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, GROUP_M: tl.constexpr):
    """G[N,K] (fp32, loaded first) += sum over the tiles, in order, of DY[rows]^T @ X[rows].

    Tile t is ``DESC[t] = (row0, count)``: slots 0..count-1 are rows row0.. of X / DY, or rows -row0-1.. of
    the staging XS / DYS (same row strides) when row0 < 0; slots past count are zero rows (masked loads).
    The reduction axis is the token axis: one canonical tile (BT tokens) per iteration, no split; the next
    tile's descriptor is loaded one iteration ahead (``_tile``).
    """
    pid_n, pid_k = tile_ids(tl.program_id(0), tl.cdiv(N, BN), tl.cdiv(K, BK), GROUP_M)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_k * BK + tl.arange(0, BK)
    rt = tl.arange(0, BT)
    n_ok = rn < N
    k_ok = rk < K
    g_ptr, g_mask, acc = _main_grad_tile(G, rn, rk, N, K, s_g)
    last = n_tiles - 1
    nxt_row0, nxt_count = _tile(DESC, 0)
    for t in range(0, n_tiles):
        row0 = nxt_row0
        count = nxt_count
        nxt_row0, nxt_count = _tile(DESC, tl.minimum(t + 1, last))
        staged = row0 < 0
        row = tl.where(staged, -row0 - 1, row0).to(tl.int64) + rt
        live = rt < count
        xb = tl.where(staged, XS, X)
        dyb = tl.where(staged, DYS, DY)
        dy = tl.load(dyb + row[:, None] * s_dy + rn[None, :], mask=live[:, None] & n_ok[None, :], other=0.0)
        x = tl.load(xb + row[:, None] * s_x + rk[None, :], mask=live[:, None] & k_ok[None, :], other=0.0)
        acc = mma(tl.trans(dy), x, acc)
    tl.store(g_ptr, acc, mask=g_mask)


@triton.jit
def _dw_tma_kernel(DESC, dy_desc, x_desc, G, n_tiles, N, K, s_g, staged,
                   BN: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, GROUP_M: tl.constexpr):
    """``_dw_kernel`` over tiles of one source (X / DY, or the staging rows when ``staged``), fed by TMA.

    ``dy_desc`` / ``x_desc`` are host-encoded row-window descriptors of the source (``_window``): element (w, j, c)
    is column c of row w + j, j < BT (both row dimensions step by one row). Tile t reads rows first .. first +
    count - 1 into slots 0 .. count - 1 and zeros into the others: the box of window first - (BT - count) at
    j0 = BT - count ends at the tile's last row, and its last BT - count rows (j >= BT) are out of bounds, so TMA
    writes zeros and reads nothing (the next sample's rows stay unread, as the masked gather leaves them). The
    window must start at a row (first >= BT - count; the host sends other tiles to ``_dw_kernel``). The same
    operands in the same slots as ``_dw_kernel``, the same chain of tensor-core steps: the same bits (GPU test).
    """
    pid_n, pid_k = tile_ids(tl.program_id(0), tl.cdiv(N, BN), tl.cdiv(K, BK), GROUP_M)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = pid_k * BK + tl.arange(0, BK)
    g_ptr, g_mask, acc = _main_grad_tile(G, rn, rk, N, K, s_g)
    last = n_tiles - 1
    nxt_row0, nxt_count = _tile(DESC, 0)
    for t in range(0, n_tiles):
        row0 = nxt_row0
        count = nxt_count
        nxt_row0, nxt_count = _tile(DESC, tl.minimum(t + 1, last))
        first = tl.where(staged != 0, -row0 - 1, row0)
        skip = BT - count
        dy = dy_desc.load([first - skip, skip, pid_n * BN]).reshape(BT, BN)
        x = x_desc.load([first - skip, skip, pid_k * BK]).reshape(BT, BK)
        acc = mma(tl.trans(dy), x, acc)
    tl.store(g_ptr, acc, mask=g_mask)


def _window(t: torch.Tensor, block: int):
    """``t`` [rows, cols] (contiguous rows) as a TMA descriptor of row windows (see ``_dw_tma_kernel``): shape
    [rows, TILE, cols], both row dimensions stepping by one row, boxes of [1, TILE, block]."""
    return TensorDescriptor(t, [t.shape[0], TILE, t.shape[1]], [t.stride(0), t.stride(0), 1], [1, TILE, block])


_DW_SHAPES = [(128, 256, 8, 3), (128, 256, 8, 4), (256, 128, 8, 3), (256, 128, 8, 4), (128, 128, 8, 4),
              (128, 128, 4, 4)]


def dw_configs(key: tuple) -> list[triton.Config]:
    """dW candidates (BN, BK, warps, stages): output tiles only; the token order is the plan's."""
    return [triton.Config({"BN": bn, "BK": bk, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bn, bk, w, s in _DW_SHAPES]


_DW = Tuner(_dw_kernel, dw_configs)
_DW_TMA = Tuner(_dw_tma_kernel, dw_configs)


def dw_fold(step: TileStep, x: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor,
            x_index: int = 0, dy_index: int = 1) -> torch.Tensor:
    """Fold the step's canonical tiles of dY^T X into fp32 ``main_grad`` [N, K] (in place).

    ``x`` [S, K] and ``dy`` [S, N] are the call's row tensors passed to ``take_tiles``, at ``x_index`` /
    ``dy_index`` of its tensors (their staging twins are ``step.stage[...]``). The kernel loads main_grad,
    folds tile after tile, stores it.
    """
    if step.tile != TILE:
        raise ValueError(f"dw_fold: the fold's tile must be gemm.TILE={TILE}, got {step.tile}")
    return dw_fold_tiles(step.desc, x, dy, main_grad, step.stage[x_index], step.stage[dy_index], step.host_desc)


def dw_fold_tiles(desc: torch.Tensor, x: torch.Tensor, dy: torch.Tensor, main_grad: torch.Tensor,
                  xs: torch.Tensor | None = None, dys: torch.Tensor | None = None,
                  host_desc: np.ndarray | None = None) -> torch.Tensor:
    """The fold kernel on explicit tensors: ``desc`` int32 [n_tiles, 2] (``TileStep.desc``), x / dy the call's
    rows and xs / dys the staging rows (default: x / dy); main_grad may be a row slice. With ``host_desc`` (the
    same descriptors on the host, ``TileStep.host_desc``) a Hopper GPU folds by TMA (``_dw_tma_kernel``), one
    launch per stretch of tiles of one source (a launch loads and stores the FP32 accumulator exactly, so a fold
    split between launches gives the bits of one; the gather kernel's bits, GPU test).

    A fold of a replayed plan (its ``host_desc`` read-only, the plan cache's) from buffers it folded before is a
    replay of the same memoised launches (``_DW_CALLS``): checks, stretches and keys are skipped, since every one of
    them is a function of what the call key holds."""
    xs = x if xs is None else xs
    dys = dy if dys is None else dys
    call_key = None
    if host_desc is not None and not host_desc.flags.writeable and not INTERPRET:
        call_key = (id(host_desc), *map(_call_part, (desc, x, dy, xs, dys, main_grad)))
        hit = _DW_CALLS.get(call_key)
        if hit is not None and hit[0] is host_desc and _DW_TMA.launch.replay_all(hit[1]):
            return main_grad
    n, k = main_grad.shape
    if main_grad.dtype != torch.float32 or main_grad.stride(1) != 1:
        raise ValueError("dw_fold: main_grad must be fp32 with contiguous rows")
    if x.shape[1] != k or dy.shape[1] != n or x.shape[0] != dy.shape[0]:
        raise ValueError(f"dw_fold: X {tuple(x.shape)}, dY {tuple(dy.shape)} do not fit main_grad {(n, k)}")
    if xs.shape[1:] != x.shape[1:] or dys.shape[1:] != dy.shape[1:] or xs.shape[0] != dys.shape[0]:
        raise ValueError("dw_fold: the staging tensors must be shaped like X and dY")
    n_tiles = desc.shape[0]
    if n_tiles == 0 or n == 0 or k == 0:
        return main_grad
    if any(t.stride(1) != 1 for t in (x, dy, xs, dys)) or xs.stride(0) != x.stride(0) or dys.stride(0) != dy.stride(0):
        raise ValueError("dw_fold: X, dY and their staging tensors must have contiguous rows of equal strides")
    bt = TILE
    if desc.dtype != torch.int32 or desc.device != x.device or not desc.is_contiguous():
        desc = desc.to(device=x.device, dtype=torch.int32).contiguous()
        call_key = None  # the launches read a copy made for this call: nothing to replay
    args = [desc, x, dy, xs, dys, main_grad, loop_bound(n_tiles), n, k, x.stride(0), dy.stride(0),
            main_grad.stride(0)]
    if INTERPRET:
        cfg = _CPU_DW
        grid = (cdiv(n, cfg["BN"]) * cdiv(k, cfg["BK"]),)
        _dw_kernel[grid](*args, **cfg, BT=bt)
        return main_grad

    def grid(meta):
        return (cdiv(n, meta["BN"]) * cdiv(k, meta["BK"]),)
    tkey = (n, k, bt, x.dtype, dy.dtype)  # the tuning key of both fold kernels
    if host_desc is None or not tma_rows_ok(x, dy, xs, dys):
        _DW(tkey, grid, args, {"BT": bt}, scratch=5)
        return main_grad
    launched: list[tuple | None] = []  # the memo key of each stretch's launch (None: not memoised)
    for a, b, kind in stretches(host_desc, bt):  # each launch loads and stores the accumulator exactly
        part = desc[a:b]
        if kind == GATHER:
            launched.append(None)
            _DW(tkey, grid, [part, *args[1:6], loop_bound(b - a), *args[7:]], {"BT": bt}, scratch=5)
            continue
        src_x, src_dy = (xs, dys) if kind == TMA_STAGED else (x, dy)

        flag = int(kind == TMA_STAGED)

        def tma_args(meta, src_x=src_x, src_dy=src_dy, part=part, tiles=b - a, flag=flag):
            return [part, _window(src_dy, meta["BN"]), _window(src_x, meta["BK"]), main_grad, loop_bound(tiles), n, k,
                    main_grad.stride(0), flag]
        # memoised on what the arguments are made of (n, k and the dtypes are in the tuning key): a step that folds
        # the same replayed plan from the same buffers again skips building, binding and expanding two descriptors
        memo_key = (part.data_ptr(), b - a, flag, src_dy.data_ptr(), src_dy.shape[0], src_dy.stride(0), src_dy.dtype,
                    src_x.data_ptr(), src_x.shape[0], src_x.stride(0), src_x.dtype, main_grad.data_ptr(),
                    main_grad.stride(0))
        launched.append(_DW_TMA.memo(memo_key, tkey, grid, None, {"BT": bt}, scratch=3, args_for=tma_args))
    if call_key is not None and None not in launched:  # every stretch memoised: the whole call replays
        if len(_DW_CALLS) >= _DW_CALLS_MAX:
            _DW_CALLS.clear()
        _DW_CALLS[call_key] = (host_desc, tuple(launched))  # host_desc kept: its id is in the key
    return main_grad


# Whole dW fold calls already launched through the memo: call key -> (host_desc, FastLaunch.memo keys of its
# stretches, in order). The key is everything the checks, the stretches and the launches read: the plan's host
# descriptors by identity (read-only, kept alive here so the id cannot be reused), and the address, shape, strides
# and dtype of every tensor (the device follows the address). Replayed all or none (``FastLaunch.replay_all``).
_DW_CALLS: dict[tuple, tuple[np.ndarray, tuple[tuple, ...]]] = {}
_DW_CALLS_MAX = 1024


def _call_part(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.shape, t.stride(), t.dtype


TMA_ROWS, TMA_STAGED, GATHER = 0, 1, 2  # how a stretch of tiles is read (``stretches``)


_LAST_STRETCHES: tuple | None = None  # (host_desc, tile, stretches) of the last call: one assignment, thread-safe


def stretches(host_desc: np.ndarray, tile: int) -> list[tuple[int, int, int]]:
    """The tile list cut into stretches of one kind, in order: ``(first tile, end, kind)`` with kind TMA_ROWS
    (windows of the call's rows), TMA_STAGED (windows of the staging rows) or GATHER (``_dw_kernel``: a tile whose
    window would start before its source's first row, a short tile among its first tile - 1 rows).

    A replayed fold plan hands every fold of a step the same read-only ``host_desc`` (the plan cache's), so the last
    answer is kept for a read-only array: ~14 us of numpy on the CPU box per dW launch, paid by every GEMM's dW of a
    step. A writable array (a caller's own) is cut every time: it could change between calls."""
    global _LAST_STRETCHES
    last = _LAST_STRETCHES
    if last is not None and last[0] is host_desc and last[1] == tile:
        return last[2]
    out = _cut_stretches(host_desc, tile)
    if not host_desc.flags.writeable:
        _LAST_STRETCHES = (host_desc, tile, out)
    return out


def _cut_stretches(host_desc: np.ndarray, tile: int) -> list[tuple[int, int, int]]:
    staged = host_desc[:, 0] < 0
    first = np.where(staged, -host_desc[:, 0].astype(np.int64) - 1, host_desc[:, 0])
    kind = np.where(first >= tile - host_desc[:, 1], np.where(staged, TMA_STAGED, TMA_ROWS), GATHER)
    cuts = [0, *(np.flatnonzero(kind[1:] != kind[:-1]) + 1).tolist(), len(kind)]
    return [(a, b, int(kind[a])) for a, b in itertools.pairwise(cuts)]


def tma_rows_ok(*tensors: torch.Tensor) -> bool:
    """Whether TMA can read these row tensors (the dW fold's row windows, linear_logp's forward): a Hopper-class
    GPU, bf16 / fp16, TMA's rules on each (``_tma_rows``: a box holds whole rows), row counts int32 can index."""
    t0 = tensors[0]
    if not t0.is_cuda or TensorDescriptor is None or _capability(t0) < 9:
        return False
    return all(t.dtype in (torch.bfloat16, torch.float16) and _tma_rows(t) and t.shape[0] < 2 ** 31 - TILE
               for t in tensors)


_CAPABILITY: dict[int, int] = {}


def _capability(t: torch.Tensor) -> int:
    """The major compute capability of t's GPU (cached per device: the driver query costs microseconds)."""
    dev = t.get_device()
    if dev not in _CAPABILITY:
        _CAPABILITY[dev] = torch.cuda.get_device_capability(dev)[0]
    return _CAPABILITY[dev]


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
            step = ctx.fold.take_tiles(ctx.rows, (x, dy), stage_copy=copy_pieces)
            dw_fold(step, x, dy, ctx.fold.main_grad)
        return dx, None, None, None


def det_linear(x: torch.Tensor, weight: torch.Tensor, rows: RowIdentity,
               fold: CanonicalFold | None) -> torch.Tensor:
    """Batch-invariant ``x @ weight.T`` (bf16 in/out, fp32 accumulate); dW by the canonical fold."""
    check_linear(x, weight, rows)
    require_fold(fold, weight, "det_linear")
    return run_function(DetLinearFn, x.contiguous(), weight.contiguous(), rows, fold)
