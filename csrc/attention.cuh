// Device helpers of the batch-invariant attention kernels (attention_fwd.cu, attention_dq.cu,
// attention_dkdv.cu): warp-level mma.sync m16n8k16 fragments, tile loads, row reductions.
//
// Why a row's bits never depend on its program (the invariance argument of every attention kernel):
// - a row's scores, P V, dP and dS K products are mma chains whose k order is fixed (head_dim in 16-steps,
//   a key block of kBlockN keys in 16-steps): the tensor core computes an output element from its row and
//   column alone, so the other rows of a tile (their number, the warp or program holding them) never matter;
// - a row's max and sum over a key block are taken by the quad of lanes that hold it: each lane sums its own
//   2 * kBlockN / 8 values in a fixed order, then two xor shuffles (commutative, so all four lanes agree).
//   The order is a function of kBlockN alone, never of the rows per program or the warps per CTA;
// - key blocks start at absolute position 0 and are folded in increasing order, so a row folds the same
//   blocks in the same order however its sample was split into calls;
// - a block past a row's position leaves the row's state exactly as it was (a select restores it), so
//   programs that reach further (their last row sits later) do not change an earlier row.
// Every FP32 operation is an explicit __f*_rn intrinsic (the build passes -fmad=false as well).
#pragma once

#include <cstdint>

#include "common.cuh"
#include "gradsweep.h"
#include "mma_gemm.cuh"

namespace gs {
namespace attn {

constexpr int kBlockN = 64;     // keys per block of the forward and dQ walks (aligned to position 0)
constexpr int kFoldTile = 32;   // queries per canonical tile of the dK / dV fold (aligned to the sample start)
constexpr int kWideWarps = 4;   // warps of a wide (prefill) dQ program
constexpr int kDqMI = 1;        // 16-row m-tiles per warp of the wide dQ: 64 rows per program
// The wide forward: 8 warps of one 16-row m-tile, 128 rows per program. (4 warps of two m-tiles needed 255
// registers and spilled, leaving two warps per scheduler: latency-bound under Nsight Compute.) A row's
// arithmetic does not depend on the warps or m-tiles of its program (attention_fwd.cu), so the bits stay.
constexpr int kFwdWarps = 8;
constexpr int kFwdMI = 1;
constexpr int kFoldWarps = 4;   // 16 keys each: 64 keys per dK / dV program
constexpr int kNarrowRows = 16; // a narrow program: one m-tile on one warp (decode steps, short tails)
// The narrow forward's warps: all load K / V, the first holds the rows; one K and one V buffer (39 KB: 4 programs
// per SM), the next block's keys loaded during this block's softmax and P V (attention_fwd.cu). A decode step
// (64 sequences x 4096 keys, 32 / 8 heads x 128) on the H200: 1062 us with one warp and two stages of K / V (74 KB,
// 3 programs per SM: 22% of DRAM bandwidth under Nsight Compute), 320 us this way (76%); rows' bits unchanged.
constexpr int kNarrowWarps = 4;
constexpr int kMaxHeadDim = 128;

// Blocks per SM a launch bound may ask for: what the shared memory allows (228 KB per SM, 1 KB reserved a block),
// at most what `regs` registers a thread allow (64 K registers per SM).
constexpr int blocks_per_sm(int smem_bytes, int threads, int regs) {
  const int by_smem = (228 * 1024) / (smem_bytes + 1024), by_regs = 65536 / (threads * regs);
  return by_smem < by_regs ? by_smem : by_regs;
}

__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x & 31u); }

// -0 -> +0, every other value (NaN included) unchanged: a masked key adds 0 * v, whose sign depends on
// whether the key's slot was written yet, so a stored exact zero must not carry that sign.
__device__ __forceinline__ float plus_zero(float x) { return __float_as_uint(x) == 0x80000000u ? 0.0f : x; }

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Sum / max over the 4 lanes of a quad (the lanes holding one accumulator row): the same bits in all four.
__device__ __forceinline__ float quad_sum(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// ---------------------------------------------------------------------------------------------- fragments
// A operand 16 x 16 (rows r0.., k k0..) of a K-major shared tile (row stride ld elements).
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16* s, int ld, int r0, int k0) {
  const int lane = lane_id();
  mma::ldmatrix_x4(a, s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + k0 + (lane >> 4) * 8);
}

// B operands of two n-tiles (n0.., n0 + 8..) x 16 k from a tile stored [n][k] (K-major): b[0], b[1] for the
// first n-tile, b[2], b[3] for the second.
__device__ __forceinline__ void frag_b_kmaj(uint32_t (&b)[4], const bf16* s, int ld, int n0, int k0) {
  const int lane = lane_id();
  mma::ldmatrix_x4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}

// The same from a tile stored [k][n] (N-major), through ldmatrix.trans.
__device__ __forceinline__ void frag_b_nmaj(uint32_t (&b)[4], const bf16* s, int ld, int k0, int n0) {
  const int lane = lane_id();
  mma::ldmatrix_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

// d[0] += a * B(n-tile 0), d[1] += a * B(n-tile 1) for a frag_b_* pair.
__device__ __forceinline__ void mma_pair(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[4]) {
  mma::mma_bf16(d0, a, b[0], b[1]);
  mma::mma_bf16(d1, a, b[2], b[3]);
}

// Accumulator fragments of NT n-tiles (a 16 x 8NT block) as A operands of NT / 2 k-steps, bf16 rounded to nearest.
template <int NT>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[NT / 2][4], const float (&c)[NT][4]) {
#pragma unroll
  for (int s = 0; s < NT / 2; ++s) {
    a[s][0] = pack_bf16(c[2 * s][0], c[2 * s][1]);
    a[s][1] = pack_bf16(c[2 * s][2], c[2 * s][3]);
    a[s][2] = pack_bf16(c[2 * s + 1][0], c[2 * s + 1][1]);
    a[s][3] = pack_bf16(c[2 * s + 1][2], c[2 * s + 1][3]);
  }
}

// x = hi + lo to 16 significant bits: hi rounded to nearest bf16, lo the rounded residual (both A operands).
template <int NT>
__device__ __forceinline__ void c_to_a_split(uint32_t (&hi)[NT / 2][4], uint32_t (&lo)[NT / 2][4],
                                             const float (&c)[NT][4]) {
#pragma unroll
  for (int s = 0; s < NT / 2; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float x = c[2 * s + (r >> 1)][(r & 1) * 2];
      const float y = c[2 * s + (r >> 1)][(r & 1) * 2 + 1];
      const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
      const float2 hf = __bfloat1622float2(h);
      hi[s][r] = *reinterpret_cast<const uint32_t*>(&h);
      lo[s][r] = pack_bf16(__fsub_rn(x, hf.x), __fsub_rn(y, hf.y));
    }
}

// ---------------------------------------------------------------------------------------------- loads
// ROWS rows of DP columns into a [ROWS][DP + 8] shared tile: row r from `row_ptr(r)` (nullptr: a zero row),
// its first D columns (the rest zero). cp.async for whole 16-byte chunks of aligned rows, else element copies
// (the same bits in shared memory either way).
template <int ROWS, int DP, int THREADS, class RowPtr>
__device__ __forceinline__ void load_tile(bf16* s, RowPtr row_ptr, int64_t D, bool vec) {
  constexpr int CPR = DP / 8;
  constexpr int LD = DP + 8;
  for (int i = threadIdx.x; i < ROWS * CPR; i += THREADS) {
    const int r = i / CPR;
    const int c = i - r * CPR;
    mma::load8(s + r * LD + c * 8, row_ptr(r), c * 8, D, vec);
  }
}

__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(mma::smem_addr(dst)), "l"(src));
}

// A program of the row kernels (forward, dQ): `cnt` consecutive tokens of one sample from physical row `row0`,
// logical token `tok0`, position `pos0`; each token contributes `pack` rows (query heads hb * pack ..).
struct Program {
  int64_t row0, tok0, pos0;
  int cnt;
  __device__ __forceinline__ explicit Program(const int32_t* table, int64_t pid) {
    const int32_t* p = table + pid * 4;
    row0 = p[0];
    tok0 = p[1];
    pos0 = p[2];
    cnt = p[3];
  }
  __device__ __forceinline__ int64_t pmax() const { return pos0 + cnt - 1; }
  __device__ __forceinline__ int64_t kv_tok() const { return tok0 - pos0; }  // token of the sample's start
};

// What the forward and dQ calls both hand their programs: Q, K, V, the program table, the shapes.
struct RowParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const int32_t* progs;
  int pack, n_hb, G;
  int64_t HQ, HKV, D, T;
  float qk_scale;
  bool vec_q, vec_kv;
};

// Key n of a sample whose first token is kv_tok, in K or V ([T, HKV, D], kv head hk); nullptr past pmax, the
// program's last row: a cache slot past it may be unwritten, so it is never read (a zero row is loaded instead).
__device__ __forceinline__ const bf16* key_row(const bf16* base, int n, int pmax, int64_t kv_tok, int64_t HKV,
                                               int64_t hk, int64_t D) {
  return n <= pmax ? base + ((kv_tok + n) * HKV + hk) * D : nullptr;
}

// The store of a forward or dQ program's rows: for each of this lane's rows (wrow + 16 i + l / 4 + 8 h) that holds
// a token, value(i, j, h, e), the FP32 value of column 8 j + 2 (l % 4) + e, goes as bf16 into the row's slot of
// `out` ([T, HQ, D]; in bf16 pairs where `pair`), and side(i, h) into side_out[hq * T + token] by the quad's first
// lane (the forward's lse, dQ's delta). One loop for both kernels of both ops: the stores are the same instructions.
template <int ND, int MI, class Value, class Side>
__device__ __forceinline__ void store_rows(const RowParams& p, const Program& pr, int hb, int wrow,
                                           const int (&pos)[MI][2], bf16* out, bool pair, float* side_out,
                                           Value value, Side side) {
  const int gq = lane_id() >> 2, tq = lane_id() & 3;
  const int pack = p.pack;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (pos[i][h] < 0) continue;
      const int r = wrow + 16 * i + gq + 8 * h;
      const int t = r / pack;
      const int64_t hq = static_cast<int64_t>(hb) * pack + (r - t * pack);
      bf16* orow = out + ((pr.row0 + t) * p.HQ + hq) * p.D;
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        const int col = 8 * j + 2 * tq;
        if (col >= p.D) continue;
        const float v0 = value(i, j, h, 0);
        const float v1 = value(i, j, h, 1);
        if (pair && col + 1 < p.D) {
          *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(v0, v1);
        } else {
          orow[col] = __float2bfloat16_rn(v0);
          if (col + 1 < p.D) orow[col + 1] = __float2bfloat16_rn(v1);
        }
      }
      if (tq == 0) side_out[hq * p.T + pr.tok0 + t] = side(i, h);
    }
}

// The fields of RowParams from a call's arguments (the 16-byte vector loads where every row allows them).
inline void set_row_params(RowParams& p, uintptr_t q, uintptr_t k, uintptr_t v, int64_t pack, int64_t HQ,
                           int64_t HKV, int64_t D, int64_t T, float qk_scale) {
  p.q = reinterpret_cast<const bf16*>(q);
  p.k = reinterpret_cast<const bf16*>(k);
  p.v = reinterpret_cast<const bf16*>(v);
  p.pack = static_cast<int>(pack);
  p.n_hb = static_cast<int>(HQ / pack);
  p.G = static_cast<int>(HQ / HKV);
  p.HQ = HQ;
  p.HKV = HKV;
  p.D = D;
  p.T = T;
  p.qk_scale = qk_scale;
  p.vec_q = aligned16(p.q) && D % 8 == 0;
  p.vec_kv = aligned16(p.k) && aligned16(p.v) && D % 8 == 0;
}

// Whether a call's wide programs run on wgmma: Hopper, head_dim 65 .. 128, unless `path` forces mma.sync (the same
// bits either way: a speed choice, never a layout's). Sets `sm90`; cudaErrorNotSupported where `path` asks for
// wgmma and it does not apply.
inline cudaError_t wide_on_sm90(int64_t D, int path, int device, bool& sm90) {
#ifndef GS_NO_SM90_GEMM
  sm90 = D > 64 && path != kGemmPortable && hopper_gemm(device);
#else
  sm90 = false;
#endif
  return path == kGemmSm90 && !sm90 ? cudaErrorNotSupported : cudaSuccess;
}

// launch(std::integral_constant<int, DP>{}, wgmma) for D's head-dim tier (32, 64, 128), the wide programs on wgmma
// where `sm90` and the tier is 128 (Hopper, head_dim 65 .. 128).
template <class Launch>
int by_head_dim(int64_t D, bool sm90, Launch launch) {
  if (D <= 32) return launch(std::integral_constant<int, 32>{}, false);
  if (D <= 64) return launch(std::integral_constant<int, 64>{}, false);
  return launch(std::integral_constant<int, 128>{}, sm90);
}

// The key-block loop of the forward and dQ programs: blocks 0 .. nb-1 of two operands through shared memory, the
// one each block uses first (forward: K for the scores; dQ: V for dP = dO V^T) and the one it uses second.
// `load(dst, src, n0)` loads the block of keys n0 .. n0 + BN - 1 of `src` (issues cp.async; no commit).
// Expects block 0 of both issued: SPLIT as two cp.async groups (first's, then second's), else as one group.
// SPLIT: one buffer per operand; the first's next block loads while this block's second use runs, the second's
// while the next block's first use runs (groups first0, second0, first1, ..: waiting for all but the newest
// group finds the operand about to be used landed). Else two stages of both, the next block loading during this
// one. Who loads and when never touches a row's arithmetic: the same bits either way.
template <int BN, bool SPLIT, class Load, class UseFirst, class UseSecond>
__device__ __forceinline__ void key_block_loop(int nb, int stage, bf16* s_first, bf16* s_second, const bf16* first,
                                               const bf16* second, Load load, UseFirst use_first,
                                               UseSecond use_second) {
  if constexpr (SPLIT) {
    for (int b = 0; b < nb; ++b) {
      mma::cp_async_wait<1>();  // the first operand of block b (the second may still land)
      __syncthreads();
      use_first(s_first, b);
      __syncthreads();  // read by every warp before the next block overwrites it
      if (b + 1 < nb) load(s_first, first, (b + 1) * BN);
      mma::cp_async_commit();
      mma::cp_async_wait<1>();  // the second operand of block b (the first of block b + 1 may still land)
      __syncthreads();
      use_second(s_second, b);
      __syncthreads();
      if (b + 1 < nb) load(s_second, second, (b + 1) * BN);
      mma::cp_async_commit();
    }
  } else {
    for (int b = 0; b < nb; ++b) {
      if (b + 1 < nb) {
        const int st = (b + 1) & 1;
        load(s_first + st * stage, first, (b + 1) * BN);
        load(s_second + st * stage, second, (b + 1) * BN);
      }
      mma::cp_async_commit();
      mma::cp_async_wait<1>();
      __syncthreads();
      use_first(s_first + (b & 1) * stage, b);
      use_second(s_second + (b & 1) * stage, b);
      __syncthreads();  // every warp is done with this stage before the next iteration's load overwrites it
    }
  }
}

}  // namespace attn
}  // namespace gs
