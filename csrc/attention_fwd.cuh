// The forward's per-row arithmetic, written once for both ways its products are issued: the mma.sync programs of
// attention_fwd.cu (wide and narrow) and the wgmma wide program of attention_fwd_sm90.cu (Hopper). Both hold a row's
// scores and output in the same accumulator layout (lane l of the warp holding rows r0 .. r0 + 15: rows r0 + l / 4
// and r0 + l / 4 + 8, columns 8 j + 2 (l % 4) + {0, 1}), so the online softmax, the masks and the store below are
// the same instructions on the same values in either kernel; with the products' k order the same (head_dim in
// 16-steps for the scores, a key block in 16-steps for P V), a row's bits do not depend on which kernel ran.
#pragma once

#include <cstdint>

#include "attention.cuh"

namespace gs {
namespace attn {

struct FwdParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* o;
  float* lse;
  const int32_t* progs;
  int pack, n_hb, G;
  int64_t HQ, HKV, D, T;
  float qk_scale;
  bool vec_q, vec_kv, pair_o;
};

// The positions of this lane's rows (wrow + 16 i + l / 4 + 8 h of the program), -1 for a slot past its tokens or
// on a warp that holds no rows.
template <int MI>
__device__ __forceinline__ void fwd_positions(const Program& pr, int pack, int wrow, bool rows_here,
                                              int (&pos)[MI][2]) {
  const int gq = lane_id() >> 2;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = (wrow + 16 * i + gq + 8 * h) / pack;
      pos[i][h] = rows_here && t < pr.cnt ? static_cast<int>(pr.pos0) + t : -1;
    }
}

// The online softmax of one key block (keys n0 ..) over a warp's rows: s (the block's raw scores) becomes p; m, l
// are updated; alpha is the rescale of the accumulator, active whether the row sees the block at all. MASKED: keys
// after a row's position are masked and rows the block lies wholly after keep their state; for a row that sees the
// whole block both variants do the same operations.
template <int NJ, int MI, bool MASKED>
__device__ __forceinline__ void fwd_softmax(float (&s)[MI][NJ][4], int n0, const int (&pos)[MI][2],
                                            float (&m)[MI][2], float (&l)[MI][2], float scale, float (&alpha)[MI][2],
                                            bool (&active)[MI][2]) {
  const int tq = lane_id() & 3;
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rel = pos[i][h] - n0;  // key c of the block is visible to the row iff c <= rel
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[i][j][2 * h + e];
          if (MASKED && 8 * j + 2 * tq + e > rel) x = -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = quad_max(mx);  // max is exact in any order
      const bool act = !MASKED || rel >= 0;
      const float m_new = fmaxf(m[i][h], __fmul_rn(mx, scale));
      const float m_use = act ? m_new : 0.0f;
      alpha[i][h] = act ? ex2(__fsub_rn(m[i][h], m_use)) : 1.0f;
      float rs = 0.0f;
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float p = ex2(__fmaf_rn(s[i][j][2 * h + e], scale, -m_use));
          s[i][j][2 * h + e] = p;
          rs = __fadd_rn(rs, p);
        }
      rs = quad_sum(rs);
      if (act) {
        m[i][h] = m_new;
        l[i][h] = __fmaf_rn(l[i][h], alpha[i][h], rs);
      }
      active[i][h] = act;
    }
}

// o = acc / l of this lane's rows (-0 stored as +0) and lse = m + log2(l), rows past the program's tokens skipped.
template <int ND, int MI>
__device__ __forceinline__ void fwd_store(const FwdParams& p, const Program& pr, int hb, int wrow,
                                          const int (&pos)[MI][2], const float (&acc)[MI][ND][4],
                                          const float (&m)[MI][2], const float (&l)[MI][2]) {
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
      bf16* orow = p.o + ((pr.row0 + t) * p.HQ + hq) * p.D;
#pragma unroll
      for (int j = 0; j < ND; ++j) {
        const int col = 8 * j + 2 * tq;
        if (col >= p.D) continue;
        const float v0 = plus_zero(__fdiv_rn(acc[i][j][2 * h], l[i][h]));
        const float v1 = plus_zero(__fdiv_rn(acc[i][j][2 * h + 1], l[i][h]));
        if (p.pair_o && col + 1 < p.D) {
          *reinterpret_cast<__nv_bfloat162*>(orow + col) = __floats2bfloat162_rn(v0, v1);
        } else {
          orow[col] = __float2bfloat16_rn(v0);
          if (col + 1 < p.D) orow[col + 1] = __float2bfloat16_rn(v1);
        }
      }
      if (tq == 0) p.lse[hq * p.T + pr.tok0 + t] = __fadd_rn(m[i][h], log2f(l[i][h]));
    }
}

#ifndef GS_NO_SM90_GEMM
// attention_fwd_sm90.cu: the wide programs on wgmma (head_dim 65 .. 128, Hopper); the same bits as fwd_kernel's.
int launch_fwd_sm90(const FwdParams& p, int64_t n_progs, cudaStream_t stream);
#endif

}  // namespace attn
}  // namespace gs
