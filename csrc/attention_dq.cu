// Batch-invariant attention dQ (and the fold's delta), per program over key blocks from position 0.
// Invariance argument: attention.cuh; programs as in attention_fwd.cu.
//
// Per row: delta_o = sum_d o * do (bf16 o, fixed order over d, as FlashAttention); per key block
//   p = 2^(s * scale - lse) (fma; masked keys -> 0), dP = dO V^T,
//   exact: dsum += rowsum(p * dP) (the FP32 delta of the exact softmax, for the dK / dV fold),
//   dq += bf16(p * (dP - delta_o)) K;
// a row the block lies wholly after keeps dq and dsum as they were. dq is stored as bf16(dq * sm_scale) with
// -0 as +0; delta[hq, token] = exact ? dsum (-0 as +0) : delta_o.
#include "attention.cuh"
#include "attention.h"

namespace gs {
namespace attn {

struct DqParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  const bf16* o;
  const bf16* dout;
  bf16* dq;
  const float* lse;
  float* delta;
  const int32_t* progs;
  int pack, n_hb, G;
  int64_t HQ, HKV, D, T;
  float qk_scale, sm_scale;
  bool exact, vec_q, vec_kv, vec_o, pair_dq;
};

// SPLIT: one K and one V buffer; V of the next block loads while this block's scores, dS and dQ run, K of the
// next block while the next block's dP runs (a wide program then fits three to an SM, at <= 168 registers);
// else two stages of K and V.
template <int DP, int WARPS, int MI, bool SPLIT = false>
struct DqCfg {
  static constexpr int BN = kBlockN, LD = DP + 8, BM = WARPS * 16 * MI, THREADS = WARPS * 32;
  static constexpr int NJ = BN / 8, ND = DP / 8, KS = DP / 16;
  static constexpr int KV_BUFS = SPLIT ? 1 : 2;
  static constexpr int SMEM = (2 * BM + 2 * KV_BUFS * BN) * LD * 2 + 2 * BM * 4;  // Q, dO, K / V, lse, delta
  // the split program asks for as many blocks as its shared memory allows, at most what 168 registers allow
  static constexpr int MIN_BLOCKS = !SPLIT ? 1 : blocks_per_sm(SMEM, THREADS, 168);
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

// A 16 x BN product of the warp's rows of A (shared, K-major) and a key block (shared, [key][d]): the k chain
// over head_dim in 16-steps. S = Q K^T and dP = dO V^T are two of them; each element depends on its row and key
// alone, so computing them in either order, or at different times, gives the same bits.
template <class C, int MI>
__device__ __forceinline__ void row_products(const bf16* sA, const bf16* sB, int wrow, float (&out)[MI][C::NJ][4]) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < C::NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) out[i][j][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < C::KS; ++kk) {
    uint32_t a[MI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i) frag_a(a[i], sA, C::LD, wrow + 16 * i, 16 * kk);
#pragma unroll
    for (int jp = 0; jp < C::NJ / 2; ++jp) {
      uint32_t b[4];
      frag_b_kmaj(b, sB, C::LD, 16 * jp, 16 * kk);
#pragma unroll
      for (int i = 0; i < MI; ++i) mma_pair(out[i][2 * jp], out[i][2 * jp + 1], a[i], b);
    }
  }
}

// One key block of dQ given dP (= dO V^T of the block): S = Q K^T, P, dS, the fold's delta, dQ += dS K.
template <class C, int MI, bool MASKED>
__device__ __forceinline__ void dq_block_k(const bf16* sQ, const bf16* sK, int wrow, int n0, const int (&pos)[MI][2],
                                           const float (&lse)[MI][2], const float (&del)[MI][2],
                                           float (&dp)[MI][C::NJ][4], float (&dsum)[MI][2],
                                           float (&dq)[MI][C::ND][4], float scale, bool exact) {
  const int tq = lane_id() & 3;
  float s[MI][C::NJ][4];
  row_products<C, MI>(sQ, sK, wrow, s);

  bool active[MI][2];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int rel = pos[i][h] - n0;
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < C::NJ; ++j)
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

  uint32_t da[MI][C::NJ / 2][4];
#pragma unroll
  for (int i = 0; i < MI; ++i) c_to_a<C::NJ>(da[i], s[i]);
#pragma unroll
  for (int jp = 0; jp < C::ND / 2; ++jp) {
    float keep[MI][2][4];
    if (MASKED) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int e = 0; e < 4; ++e) keep[i][x][e] = dq[i][2 * jp + x][e];
    }
#pragma unroll
    for (int c = 0; c < C::NJ / 2; ++c) {
      uint32_t b[4];
      frag_b_nmaj(b, sK, C::LD, 16 * c, 16 * jp);
#pragma unroll
      for (int i = 0; i < MI; ++i) mma_pair(dq[i][2 * jp], dq[i][2 * jp + 1], da[i][c], b);
    }
    if (MASKED) {
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!active[i][e >> 1]) dq[i][2 * jp + x][e] = keep[i][x][e];
    }
  }
}

template <int DP, int WARPS, int MI, bool SPLIT>
__global__ void __launch_bounds__(WARPS * 32, DqCfg<DP, WARPS, MI, SPLIT>::MIN_BLOCKS) dq_kernel(DqParams p) {
  using C = DqCfg<DP, WARPS, MI, SPLIT>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sO = sQ + C::BM * C::LD;  // dO
  bf16* sK = sO + C::BM * C::LD;
  bf16* sV = sK + C::KV_BUFS * C::BN * C::LD;
  float* sLse = reinterpret_cast<float*>(sV + C::KV_BUFS * C::BN * C::LD);
  float* sDel = sLse + C::BM;

  const int64_t pid = blockIdx.x / p.n_hb;
  const int hb = static_cast<int>(blockIdx.x - pid * p.n_hb);
  const Program pr(p.progs, pid);
  const int pack = p.pack;
  const int64_t hk = (static_cast<int64_t>(hb) * pack) / p.G;
  const int64_t kv_tok = pr.kv_tok();
  const int pmax = static_cast<int>(pr.pmax());

  auto row_off = [&](int r) -> int64_t {  // element offset of row r in q / o / do / dq, or -1
    const int t = r / pack;
    return t < pr.cnt ? ((pr.row0 + t) * p.HQ + hb * pack + (r - t * pack)) * p.D : -1;
  };
  load_tile<C::BM, DP, C::THREADS>(sQ, [&](int r) -> const bf16* {
    const int64_t off = row_off(r);
    return off >= 0 ? p.q + off : nullptr;
  }, p.D, p.vec_q);
  load_tile<C::BM, DP, C::THREADS>(sO, [&](int r) -> const bf16* {
    const int64_t off = row_off(r);
    return off >= 0 ? p.dout + off : nullptr;
  }, p.D, p.vec_o);
  auto load_keys = [&](bf16* dst, const bf16* base, int n0) {
    load_tile<C::BN, DP, C::THREADS>(dst, [=](int r) -> const bf16* {
      const int n = n0 + r;
      return n <= pmax ? base + ((kv_tok + n) * p.HKV + hk) * p.D : nullptr;
    }, p.D, p.vec_kv);
  };
  load_keys(sV, p.v, 0);  // block 0 of both, V first: dP is computed first (SPLIT: as two cp.async groups)
  if constexpr (SPLIT) mma::cp_async_commit();
  load_keys(sK, p.k, 0);
  mma::cp_async_commit();
  for (int r = threadIdx.x; r < C::BM; r += C::THREADS) {  // per row: lse and delta_o (dead slots: 0)
    const int64_t off = row_off(r);
    float lse = 0.0f, del = 0.0f;
    if (off >= 0) {
      const int t = r / pack;
      lse = p.lse[(static_cast<int64_t>(hb) * pack + (r - t * pack)) * p.T + pr.tok0 + t];
      del = row_dot(p.o + off, p.dout + off, p.D, p.vec_o);
    }
    sLse[r] = lse;
    sDel[r] = del;
  }
  __syncthreads();

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int gq = lane_id() >> 2, tq = lane_id() & 3;
  const int wrow = warp * 16 * MI;
  int pos[MI][2];
  float lse[MI][2], del[MI][2], dsum[MI][2], dq[MI][C::ND][4];
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
    for (int j = 0; j < C::ND; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[i][j][e] = 0.0f;
  }

  const int nb = pmax / C::BN + 1;
  const int nb_full = (static_cast<int>(pr.pos0) + 1) / C::BN;
  float dp[MI][C::NJ][4];
  auto rest = [&](const bf16* k_s, int b) {
    if (b < nb_full) {
      dq_block_k<C, MI, false>(sQ, k_s, wrow, b * C::BN, pos, lse, del, dp, dsum, dq, p.qk_scale, p.exact);
    } else {
      dq_block_k<C, MI, true>(sQ, k_s, wrow, b * C::BN, pos, lse, del, dp, dsum, dq, p.qk_scale, p.exact);
    }
  };
  auto products = [&](const bf16* v_s, int) { row_products<C, MI>(sO, v_s, wrow, dp); };  // dP = dO V^T first
  key_block_loop<C::BN, SPLIT>(nb, C::BN * C::LD, sV, sK, p.v, p.k, load_keys, products, rest);

#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (pos[i][h] < 0) continue;
      const int r = wrow + 16 * i + gq + 8 * h;
      const int t = r / pack;
      const int64_t hq = static_cast<int64_t>(hb) * pack + (r - t * pack);
      bf16* out = p.dq + ((pr.row0 + t) * p.HQ + hq) * p.D;
#pragma unroll
      for (int j = 0; j < C::ND; ++j) {
        const int col = 8 * j + 2 * tq;
        if (col >= p.D) continue;
        const float v0 = plus_zero(__fmul_rn(dq[i][j][2 * h], p.sm_scale));
        const float v1 = plus_zero(__fmul_rn(dq[i][j][2 * h + 1], p.sm_scale));
        if (p.pair_dq && col + 1 < p.D) {
          *reinterpret_cast<__nv_bfloat162*>(out + col) = __floats2bfloat162_rn(v0, v1);
        } else {
          out[col] = __float2bfloat16_rn(v0);
          if (col + 1 < p.D) out[col + 1] = __float2bfloat16_rn(v1);
        }
      }
      if (tq == 0) p.delta[hq * p.T + pr.tok0 + t] = p.exact ? plus_zero(dsum[i][h]) : del[i][h];
    }
}

template <int DP, int WARPS, int MI, bool SPLIT>
int launch_dq(const DqParams& p, int64_t n_progs, cudaStream_t stream) {
  using C = DqCfg<DP, WARPS, MI, SPLIT>;
  if (n_progs == 0) return 0;
  const int64_t grid = n_progs * p.n_hb;
  if (grid > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  constexpr auto kernel = dq_kernel<DP, WARPS, MI, SPLIT>;
  GS_TRY(dynamic_smem_once<kernel>(C::SMEM));
  kernel<<<static_cast<unsigned>(grid), C::THREADS, C::SMEM, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

template <int DP>
int launch_dq_both(DqParams p, const int32_t* wide, int64_t n_wide, const int32_t* narrow, int64_t n_narrow,
                   cudaStream_t stream) {
  p.progs = wide;
  // wide programs: one K and one V buffer, three to an SM (measured on the H200: dQ 707 -> 583 us at 8 x 1024)
  const int err = launch_dq<DP, kWideWarps, kDqMI, true>(p, n_wide, stream);
  if (err != 0) return err;
  p.progs = narrow;
  return launch_dq<DP, 1, 1, false>(p, n_narrow, stream);
}

}  // namespace attn

int attn_dq(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t dout, uintptr_t dq, uintptr_t lse,
            uintptr_t delta, uintptr_t wide, int64_t n_wide, uintptr_t narrow, int64_t n_narrow, int64_t pack,
            int64_t HQ, int64_t HKV, int64_t D, int64_t T, float qk_scale, float sm_scale, bool exact, int device,
            uintptr_t stream) {
  if (n_wide + n_narrow == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  attn::DqParams p{};
  p.q = reinterpret_cast<const bf16*>(q);
  p.k = reinterpret_cast<const bf16*>(k);
  p.v = reinterpret_cast<const bf16*>(v);
  p.o = reinterpret_cast<const bf16*>(o);
  p.dout = reinterpret_cast<const bf16*>(dout);
  p.dq = reinterpret_cast<bf16*>(dq);
  p.lse = reinterpret_cast<const float*>(lse);
  p.delta = reinterpret_cast<float*>(delta);
  p.pack = static_cast<int>(pack);
  p.n_hb = static_cast<int>(HQ / pack);
  p.G = static_cast<int>(HQ / HKV);
  p.HQ = HQ;
  p.HKV = HKV;
  p.D = D;
  p.T = T;
  p.qk_scale = qk_scale;
  p.sm_scale = sm_scale;
  p.exact = exact;
  p.vec_q = aligned16(p.q) && D % 8 == 0;
  p.vec_kv = aligned16(p.k) && aligned16(p.v) && D % 8 == 0;
  p.vec_o = aligned16(p.o) && aligned16(p.dout) && D % 8 == 0;
  p.pair_dq = D % 2 == 0 && (dq & 3u) == 0;
  const auto* w = reinterpret_cast<const int32_t*>(wide);
  const auto* nw = reinterpret_cast<const int32_t*>(narrow);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (D <= 32) return attn::launch_dq_both<32>(p, w, n_wide, nw, n_narrow, s);
  if (D <= 64) return attn::launch_dq_both<64>(p, w, n_wide, nw, n_narrow, s);
  return attn::launch_dq_both<128>(p, w, n_wide, nw, n_narrow, s);
}

}  // namespace gs
