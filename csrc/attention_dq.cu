// Batch-invariant attention dQ (and the fold's delta), per program over key blocks from position 0.
// Invariance argument: attention.cuh; programs as in attention_fwd.cu.
//
// Per row: delta_o = sum_d o * do (bf16 o, fixed order over d, as FlashAttention); per key block
//   p = 2^(s * scale - lse) (fma; masked keys -> 0), dP = dO V^T,
//   exact: dsum += rowsum(p * dP) (the FP32 delta of the exact softmax, for the dK / dV fold),
//   dq += bf16(p * (dP - delta_o)) K;
// a row the block lies wholly after keeps dq and dsum as they were. dq is stored as bf16(dq * sm_scale) with
// -0 as +0; delta[hq, token] = exact ? dsum (-0 as +0) : delta_o.
#include "attention.h"
#include "attention_dq.cuh"
#include "gradsweep.h"

namespace gs {
namespace attn {

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
  float s[MI][C::NJ][4];
  row_products<C, MI>(sQ, sK, wrow, s);

  bool active[MI][2];
  dq_elements<C::NJ, MI, MASKED>(s, dp, n0, pos, lse, del, dsum, scale, exact, active);

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

  auto row_off = [&](int r) { return dq_row_offset(p, pr, hb, r); };
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
      return key_row(base, n0 + r, pmax, kv_tok, p.HKV, hk, p.D);
    }, p.D, p.vec_kv);
  };
  load_keys(sV, p.v, 0);  // block 0 of both, V first: dP is computed first (SPLIT: as two cp.async groups)
  if constexpr (SPLIT) mma::cp_async_commit();
  load_keys(sK, p.k, 0);
  mma::cp_async_commit();
  dq_row_stats<C::BM, C::THREADS>(p, pr, hb, sLse, sDel);
  __syncthreads();

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int wrow = warp * 16 * MI;
  int pos[MI][2];
  float lse[MI][2], del[MI][2], dsum[MI][2], dq[MI][C::ND][4];
  dq_row_state<C::ND, MI>(pr, pack, wrow, sLse, sDel, pos, lse, del, dsum, dq);

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

  dq_store<C::ND, MI>(p, pr, hb, wrow, pos, dq, dsum, del);
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

// The wide programs (on wgmma where `sm90`: Hopper, head_dim 65 .. 128), then the narrow ones.
template <int DP>
int launch_dq_both(DqParams p, const int32_t* wide, int64_t n_wide, const int32_t* narrow, int64_t n_narrow,
                   bool sm90, cudaStream_t stream) {
  p.progs = wide;
  int err = 0;
  if (sm90) {
#ifndef GS_NO_SM90_GEMM
    err = launch_dq_sm90(p, n_wide, stream);
#endif
  } else {
    // one K and one V buffer, three to an SM (measured on the H200: dQ 707 -> 583 us at 8 x 1024)
    err = launch_dq<DP, kWideWarps, kDqMI, true>(p, n_wide, stream);
  }
  if (err != 0) return err;
  p.progs = narrow;
  return launch_dq<DP, 1, 1, false>(p, n_narrow, stream);
}

}  // namespace attn

int attn_dq(uintptr_t q, uintptr_t k, uintptr_t v, uintptr_t o, uintptr_t dout, uintptr_t dq, uintptr_t lse,
            uintptr_t delta, uintptr_t wide, int64_t n_wide, uintptr_t narrow, int64_t n_narrow, int64_t pack,
            int64_t HQ, int64_t HKV, int64_t D, int64_t T, float qk_scale, float sm_scale, bool exact, int device,
            uintptr_t stream, int path) {
  if (n_wide + n_narrow == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  attn::DqParams p{};
  attn::set_row_params(p, q, k, v, pack, HQ, HKV, D, T, qk_scale);
  p.o = reinterpret_cast<const bf16*>(o);
  p.dout = reinterpret_cast<const bf16*>(dout);
  p.dq = reinterpret_cast<bf16*>(dq);
  p.lse = reinterpret_cast<const float*>(lse);
  p.delta = reinterpret_cast<float*>(delta);
  p.sm_scale = sm_scale;
  p.exact = exact;
  p.vec_o = aligned16(p.o) && aligned16(p.dout) && D % 8 == 0;
  p.pair_dq = D % 2 == 0 && (dq & 3u) == 0;
  bool sm90 = false;
  GS_TRY(attn::wide_on_sm90(D, path, device, sm90));
  return attn::by_head_dim(D, sm90, [&](auto dp, bool wgmma) {
    return attn::launch_dq_both<decltype(dp)::value>(p, reinterpret_cast<const int32_t*>(wide), n_wide,
                                                     reinterpret_cast<const int32_t*>(narrow), n_narrow, wgmma,
                                                     reinterpret_cast<cudaStream_t>(stream));
  });
}

}  // namespace gs
