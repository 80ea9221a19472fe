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

// A forward call: RowParams, then the output and its row log-sum-exp (base 2).
struct FwdParams : RowParams {
  bf16* o;
  float* lse;
  bool pair_o;
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
  store_rows<ND, MI>(
      p, pr, hb, wrow, pos, p.o, p.pair_o, p.lse,
      [&](int i, int j, int h, int e) { return plus_zero(__fdiv_rn(acc[i][j][2 * h + e], l[i][h])); },
      [&](int i, int h) { return __fadd_rn(m[i][h], log2f(l[i][h])); });
}

#ifndef GS_NO_SM90_GEMM
// attention_fwd_sm90.cu: the wide programs on wgmma (head_dim 65 .. 128, Hopper); the same bits as fwd_kernel's.
int launch_fwd_sm90(const FwdParams& p, int64_t n_progs, cudaStream_t stream);
#endif

}  // namespace attn
}  // namespace gs
