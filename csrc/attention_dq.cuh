// dQ's per-row arithmetic, written once for both ways its products are issued: the mma.sync programs of
// attention_dq.cu (wide and narrow) and the wgmma wide program of attention_dq_sm90.cu (Hopper). As in the forward
// (attention_fwd.cuh), both kernels hold a row's scores, dP and dQ in the same accumulator layout, so the element
// work below runs the same instructions on the same values in either kernel; with the products' k order the same
// (head_dim in 16-steps for S and dP, the block's keys in 16-steps for dQ), a row's bits do not depend on the kernel.
#pragma once

#include <cstdint>

#include "attention.cuh"

namespace gs {
namespace attn {

// A dQ call: RowParams, then O, dO, the output, the forward's lse and delta (read, or written where `exact`).
struct DqParams : RowParams {
  const bf16* o;
  const bf16* dout;
  bf16* dq;
  const float* lse;
  float* delta;
  float sm_scale;
  bool exact, vec_o, pair_dq;
};

// sum_d o[d] * do[d] in d order (16-byte and element loads read the same values in the same order).
__device__ __forceinline__ float row_dot(const bf16* a, const bf16* b, int64_t D, bool vec) {
  float acc = 0.0f;
  if (vec) {
    for (int64_t c = 0; c < D / 8; ++c) {
      float fa[8], fb[8];
      unpack8(__ldg(reinterpret_cast<const uint4*>(a) + c), fa);
      unpack8(__ldg(reinterpret_cast<const uint4*>(b) + c), fb);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = __fadd_rn(acc, __fmul_rn(fa[e], fb[e]));
    }
  } else {
    for (int64_t d = 0; d < D; ++d) acc = __fadd_rn(acc, __fmul_rn(__bfloat162float(a[d]), __bfloat162float(b[d])));
  }
  return acc;
}

// Element offset of a program's row r in q / o / do / dq, or -1 for a slot past its tokens.
__device__ __forceinline__ int64_t dq_row_offset(const DqParams& p, const Program& pr, int hb, int r) {
  const int t = r / p.pack;
  return t < pr.cnt ? ((pr.row0 + t) * p.HQ + hb * p.pack + (r - t * p.pack)) * p.D : -1;
}

// Per row of the program: lse and delta_o = o . do into shared memory (dead slots: 0), by THREADS threads.
template <int BM, int THREADS>
__device__ __forceinline__ void dq_row_stats(const DqParams& p, const Program& pr, int hb, float* sLse,
                                             float* sDel) {
  for (int r = threadIdx.x; r < BM; r += THREADS) {
    const int64_t off = dq_row_offset(p, pr, hb, r);
    float lse = 0.0f, del = 0.0f;
    if (off >= 0) {
      const int t = r / p.pack;
      lse = p.lse[(static_cast<int64_t>(hb) * p.pack + (r - t * p.pack)) * p.T + pr.tok0 + t];
      del = row_dot(p.o + off, p.dout + off, p.D, p.vec_o);
    }
    sLse[r] = lse;
    sDel[r] = del;
  }
}

// This lane's rows (wrow + 16 i + l / 4 + 8 h): position (-1 past the program's tokens), lse and delta_o from
// shared memory; dsum and dq start at zero.
template <int ND, int MI>
__device__ __forceinline__ void dq_row_state(const Program& pr, int pack, int wrow, const float* sLse,
                                             const float* sDel, int (&pos)[MI][2], float (&lse)[MI][2],
                                             float (&del)[MI][2], float (&dsum)[MI][2], float (&dq)[MI][ND][4]) {
  const int gq = lane_id() >> 2;
#pragma unroll
  for (int i = 0; i < MI; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wrow + 16 * i + gq + 8 * h;
      const int t = r / pack;
      pos[i][h] = t < pr.cnt ? static_cast<int>(pr.pos0) + t : -1;
      lse[i][h] = sLse[r];
      del[i][h] = sDel[r];
      dsum[i][h] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < ND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[i][j][e] = 0.0f;
  }
}

// One key block's element work (keys n0 ..): s (the block's raw scores) becomes dS = p * (dP - delta_o) before its
// bf16 rounding, with p = 2^(s * scale - lse) (masked keys: p = 0); exact: dsum += rowsum(p * dP) in lane order, then
// the quad. active: whether the row sees the block at all (a row the block lies wholly after keeps dq and dsum).
template <int NJ, int MI, bool MASKED>
__device__ __forceinline__ void dq_elements(float (&s)[MI][NJ][4], const float (&dp)[MI][NJ][4], int n0,
                                            const int (&pos)[MI][2], const float (&lse)[MI][2],
                                            const float (&del)[MI][2], float (&dsum)[MI][2], float scale, bool exact,
                                            bool (&active)[MI][2]) {
  const int tq = lane_id() & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rel = pos[i][h] - n0;
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float x = s[i][j][2 * h + e];
          if (MASKED && 8 * j + 2 * tq + e > rel) x = -INFINITY;
          const float p = ex2(__fmaf_rn(x, scale, -lse[i][h]));
          const float d = dp[i][j][2 * h + e];
          part = __fadd_rn(part, __fmul_rn(p, d));
          s[i][j][2 * h + e] = __fmul_rn(p, __fsub_rn(d, del[i][h]));  // dS (before the bf16 rounding)
        }
      if (exact) part = quad_sum(part);  // a warp-uniform branch: every lane of the quad takes it
      const bool act = !MASKED || rel >= 0;
      if (exact && act) dsum[i][h] = __fadd_rn(dsum[i][h], part);
      active[i][h] = act;
    }
}

// dq stored as bf16(dq * sm_scale) (-0 as +0) and delta = exact ? dsum (-0 as +0) : delta_o, for this lane's rows.
template <int ND, int MI>
__device__ __forceinline__ void dq_store(const DqParams& p, const Program& pr, int hb, int wrow,
                                         const int (&pos)[MI][2], const float (&dq)[MI][ND][4],
                                         const float (&dsum)[MI][2], const float (&del)[MI][2]) {
  store_rows<ND, MI>(
      p, pr, hb, wrow, pos, p.dq, p.pair_dq, p.delta,
      [&](int i, int j, int h, int e) { return plus_zero(__fmul_rn(dq[i][j][2 * h + e], p.sm_scale)); },
      [&](int i, int h) { return p.exact ? plus_zero(dsum[i][h]) : del[i][h]; });
}

#ifndef GS_NO_SM90_GEMM
// attention_dq_sm90.cu: the wide programs on wgmma (head_dim 65 .. 128, Hopper); the same bits as dq_kernel's.
int launch_dq_sm90(const DqParams& p, int64_t n_progs, cudaStream_t stream);
#endif

}  // namespace attn
}  // namespace gs
