// The dK / dV fold's parameters and the per-element steps both of its kernels share (attention_dkdv.cu: mma.sync,
// any GPU; attention_dkdv_sm90.cu: wgmma, Hopper). A fold program owns kFoldWarps * 16 = 64 keys of one sample and
// one K / V head; its thread of warp w holds, in mma.sync's and wgmma's common accumulator layout, key rows
// 16 w + lane / 4 (+ 8) and columns 8 j + 2 (lane % 4) (+ 1). Everything here is per element, so the two kernels
// give an element the same operations in the same order: the kernels differ only in how the products are issued.
#pragma once

#include <cstdint>

#include "attention.cuh"

namespace gs {
namespace attn {

struct KvParams {
  const bf16* k;
  const bf16* v;
  const bf16* q;
  const bf16* dout;
  const float* lse;
  const float* delta;
  float* dk;
  float* dv;
  const int32_t* work;
  int G;
  int64_t HQ, HKV, D, T;
  float qk_scale, sm_scale;
  bool load_acc, vec_kv, vec_q, pair_acc;
};

// A program's work entry: the sample's first token, the block's first key, the sample's length; and its tiles.
struct FoldProgram {
  int64_t tok_base;
  int64_t hk;
  int k0, L;
  int t_first;  // the first canonical query tile holding a query that sees a key of the block
  int n_tiles;  // tiles t_first .. of the sample
  __device__ __forceinline__ FoldProgram(const KvParams& p, int tile) {
    const int64_t w = blockIdx.x / p.HKV;
    hk = blockIdx.x - w * p.HKV;
    tok_base = p.work[3 * w];
    k0 = p.work[3 * w + 1];
    L = p.work[3 * w + 2];
    t_first = (k0 / tile) * tile;
    n_tiles = (L + tile - 1) / tile - t_first / tile;
  }
  // Key row r of the block in a [T, HKV, D] store (nullptr past the sample's end: a zero row).
  __device__ __forceinline__ const bf16* key_row(const KvParams& p, const bf16* base, int r) const {
    const int n = k0 + r;
    return n < L ? base + ((tok_base + n) * p.HKV + hk) * p.D : nullptr;
  }
  // Query position qpos's row of head hq in a [T, HQ, D] store (nullptr past the sample's end).
  __device__ __forceinline__ const bf16* query_row(const KvParams& p, const bf16* base, int64_t hq, int qpos) const {
    return qpos < L ? base + ((tok_base + qpos) * p.HQ + hq) * p.D : nullptr;
  }
};

// lse and delta of TILE queries from t0 (head hq) into shared memory: cp.async inside the sample, else +inf and 0
// (p = 2^(s - inf) = 0 past the sample's end).
template <int TILE, int THREADS>
__device__ __forceinline__ void load_lse_delta(float* lse_s, float* del_s, const KvParams& p, const FoldProgram& f,
                                               int64_t hq, int t0) {
  for (int r = threadIdx.x; r < TILE; r += THREADS) {
    const int qpos = t0 + r;
    if (qpos < f.L) {
      const int64_t at = hq * p.T + f.tok_base + qpos;
      cp_async4(lse_s + r, p.lse + at);
      cp_async4(del_s + r, p.delta + at);
    } else {
      lse_s[r] = INFINITY;
      del_s[r] = 0.0f;
    }
  }
}

// The FP32 accumulators of the thread's elements: the main grads (loaded before the fold) or zero.
template <int ND>
__device__ __forceinline__ void load_fold_acc(float (&dk)[ND][4], float (&dv)[ND][4], const KvParams& p,
                                              const FoldProgram& f, int wrow) {
  const int gq = lane_id() >> 2, tq = lane_id() & 3;
#pragma unroll
  for (int j = 0; j < ND; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kpos = f.k0 + wrow + gq + 8 * (e >> 1);
      const int col = 8 * j + 2 * tq + (e & 1);
      const bool live = p.load_acc && kpos < f.L && col < p.D;
      const int64_t at = ((f.tok_base + kpos) * p.HKV + f.hk) * p.D + col;
      dk[j][e] = live ? p.dk[at] : 0.0f;
      dv[j][e] = live ? p.dv[at] : 0.0f;
    }
}

// Whether the thread's element (tile column j, element e) of the tile from t0 lies outside key <= query < length,
// on the tiles that need the test (the diagonal, the sample's last tile).
template <int TILE, int BK>
__device__ __forceinline__ bool fold_masked(const FoldProgram& f, int t0, int wrow, int j, int e) {
  const int gq = lane_id() >> 2, tq = lane_id() & 3;
  const bool tile_masked = t0 < f.k0 + BK - 1 || t0 + TILE > f.L;
  const int qpos = t0 + 8 * j + 2 * tq + (e & 1);
  const int kpos = f.k0 + wrow + gq + 8 * (e >> 1);
  return tile_masked && !(kpos <= qpos && qpos < f.L);
}

// S^T -> P^T = 2^(S^T * scale - lse) (fma), in place, masked to zero by a select (never a product with zero).
template <int NT, int TILE, int BK>
__device__ __forceinline__ void fold_p(float (&s)[NT][4], const float* lse_s, const KvParams& p,
                                       const FoldProgram& f, int t0, int wrow) {
  const int tq = lane_id() & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pt = ex2(__fmaf_rn(s[j][e], p.qk_scale, -lse_s[8 * j + 2 * tq + (e & 1)]));
      s[j][e] = fold_masked<TILE, BK>(f, t0, wrow, j, e) ? 0.0f : pt;
    }
}

// dP^T -> dS^T = P^T * (dP^T - delta) * sm_scale, in place, from fold_p's P^T; masked as there.
template <int NT, int TILE, int BK>
__device__ __forceinline__ void fold_ds(const float (&pt)[NT][4], float (&dp)[NT][4], const float* del_s,
                                        const KvParams& p, const FoldProgram& f, int t0, int wrow) {
  const int tq = lane_id() & 3;
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float ds = __fmul_rn(__fmul_rn(pt[j][e], __fsub_rn(dp[j][e], del_s[8 * j + 2 * tq + (e & 1)])),
                                 p.sm_scale);
      dp[j][e] = fold_masked<TILE, BK>(f, t0, wrow, j, e) ? 0.0f : ds;
    }
}

// Both, in place: s holds P^T and dp holds dS^T after it.
template <int NT, int TILE, int BK>
__device__ __forceinline__ void fold_elements(float (&s)[NT][4], float (&dp)[NT][4], const float* lse_s,
                                              const float* del_s, const KvParams& p, const FoldProgram& f, int t0,
                                              int wrow) {
  fold_p<NT, TILE, BK>(s, lse_s, p, f, t0, wrow);
  fold_ds<NT, TILE, BK>(s, dp, del_s, p, f, t0, wrow);
}

// The thread's accumulators to the dk / dv stores (key rows inside the sample, columns below D).
template <int ND>
__device__ __forceinline__ void store_fold_acc(const float (&dk)[ND][4], const float (&dv)[ND][4], const KvParams& p,
                                               const FoldProgram& f, int wrow) {
  const int gq = lane_id() >> 2, tq = lane_id() & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int kpos = f.k0 + wrow + gq + 8 * h;
    if (kpos >= f.L) continue;
    const int64_t row = ((f.tok_base + kpos) * p.HKV + f.hk) * p.D;
#pragma unroll
    for (int j = 0; j < ND; ++j) {
      const int col = 8 * j + 2 * tq;
      if (col >= p.D) continue;
      if (p.pair_acc && col + 1 < p.D) {
        *reinterpret_cast<float2*>(p.dk + row + col) = make_float2(dk[j][2 * h], dk[j][2 * h + 1]);
        *reinterpret_cast<float2*>(p.dv + row + col) = make_float2(dv[j][2 * h], dv[j][2 * h + 1]);
      } else {
        p.dk[row + col] = dk[j][2 * h];
        p.dv[row + col] = dv[j][2 * h];
        if (col + 1 < p.D) {
          p.dk[row + col + 1] = dk[j][2 * h + 1];
          p.dv[row + col + 1] = dv[j][2 * h + 1];
        }
      }
    }
  }
}

#ifndef GS_NO_SM90_GEMM
// attention_dkdv_sm90.cu: the wgmma fold of head_dim 65 .. 128 (Hopper). Same bits as the mma.sync fold.
int launch_dkdv_sm90(const KvParams& p, int64_t n_work, bool fp32_grads, cudaStream_t stream);
#endif

}  // namespace attn
}  // namespace gs
