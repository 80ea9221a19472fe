// Batch-invariant attention dK / dV: one fold over canonical query tiles, after every token's backward.
//
// A program owns kFoldWarps * 16 keys of one sample (a block aligned to the sample's start) and one K/V head.
// It loads the FP32 accumulators (the main grads, or zero), then adds, for each query head of the group in head
// order and each canonical query tile (kFoldTile queries aligned to the sample's start) in position order:
//   S^T = K Q^T, P^T = 2^(S^T * scale - lse) (fma), dP^T = V dO^T, dS^T = P^T * (dP^T - delta) * sm_scale,
//   masked to key <= query < length (a select, never a product with zero);
//   dV += P^T dO, dK += dS^T Q (FP32_GRADS: P^T and dS^T as hi + lo bf16 pairs, hi then lo per 16 queries),
// and stores them. Every input (the K / V / Q / dO stores, lse, delta) is indexed by logical token and every
// loop bound is a function of the sample's length and the key block, so any split of the step into calls and
// any order of their backwards give the same bits. Each key row has one writer: no atomics.
#include "attention.h"
#include "attention_dkdv.cuh"
#include "gradsweep.h"

namespace gs {
namespace attn {

// STAGES: query tiles in flight (Q, dO, lse, delta of tile it + STAGES - 1 load during tile it's products).
template <int DP, int WARPS, int STAGES>
struct KvCfg {
  static constexpr int BK = WARPS * 16, TILE = kFoldTile, LD = DP + 8, THREADS = WARPS * 32;
  static constexpr int NT = TILE / 8, ND = DP / 8, KS = DP / 16;
  // K, V, then Q and dO tiles of STAGES pipeline stages, then lse and delta of STAGES stages
  static constexpr int SMEM = (2 * BK + 2 * STAGES * TILE) * LD * 2 + 2 * STAGES * TILE * 4;
};

template <int DP, int WARPS, bool FP32_GRADS, int STAGES>
__global__ void __launch_bounds__(WARPS * 32) dkdv_kernel(KvParams p) {
  using C = KvCfg<DP, WARPS, STAGES>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sK = reinterpret_cast<bf16*>(smem_raw);
  bf16* sV = sK + C::BK * C::LD;
  bf16* sQ = sV + C::BK * C::LD;            // [STAGES][TILE][LD]
  bf16* sO = sQ + STAGES * C::TILE * C::LD; // dO, [STAGES][TILE][LD]
  float* sLse = reinterpret_cast<float*>(sO + STAGES * C::TILE * C::LD);
  float* sDel = sLse + STAGES * C::TILE;

  const FoldProgram f(p, C::TILE);
  const auto key_rows = [&](const bf16* base) { return [=](int r) { return f.key_row(p, base, r); }; };
  load_tile<C::BK, DP, C::THREADS>(sK, key_rows(p.k), p.D, p.vec_kv);
  load_tile<C::BK, DP, C::THREADS>(sV, key_rows(p.v), p.D, p.vec_kv);

  const int n_tiles = f.n_tiles;
  const int n_it = p.G * n_tiles;  // (head of the group, tile), heads outer
  auto load_tile_q = [&](int it, int stage) {
    const int g = it / n_tiles;
    const int t0 = f.t_first + (it - g * n_tiles) * C::TILE;
    const int64_t hq = f.hk * p.G + g;
    const auto rows = [&](const bf16* base) { return [=](int r) { return f.query_row(p, base, hq, t0 + r); }; };
    load_tile<C::TILE, DP, C::THREADS>(sQ + stage * C::TILE * C::LD, rows(p.q), p.D, p.vec_q);
    load_tile<C::TILE, DP, C::THREADS>(sO + stage * C::TILE * C::LD, rows(p.dout), p.D, p.vec_q);
    load_lse_delta<C::TILE, C::THREADS>(sLse + stage * C::TILE, sDel + stage * C::TILE, p, f, hq, t0);
  };
  // Tiles 0 .. STAGES - 2 (K and V ride with tile 0's group); one group per stage, empty past the last tile.
#pragma unroll
  for (int st = 0; st < STAGES - 1; ++st) {
    if (st < n_it) load_tile_q(st, st);
    mma::cp_async_commit();
  }

  const int warp = static_cast<int>(threadIdx.x >> 5);
  const int wrow = warp * 16;
  float dk[C::ND][4], dv[C::ND][4];
  load_fold_acc<C::ND>(dk, dv, p, f, wrow);  // the main grad, loaded before the fold

  for (int it = 0; it < n_it; ++it) {
    mma::cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile it is in shared memory; every warp is done with tile it - 1 (its stage is free)
    if (it + STAGES - 1 < n_it) load_tile_q(it + STAGES - 1, (it + STAGES - 1) % STAGES);
    mma::cp_async_commit();
    const int st = it % STAGES;
    const bf16* q_s = sQ + st * C::TILE * C::LD;
    const bf16* o_s = sO + st * C::TILE * C::LD;
    const float* lse_s = sLse + st * C::TILE;
    const float* del_s = sDel + st * C::TILE;
    const int t0 = f.t_first + (it % n_tiles) * C::TILE;

    float s[C::NT][4], dp[C::NT][4];
#pragma unroll
    for (int j = 0; j < C::NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = 0.0f;
        dp[j][e] = 0.0f;
      }
#pragma unroll
    for (int kk = 0; kk < C::KS; ++kk) {
      uint32_t ka[4], va[4];
      frag_a(ka, sK, C::LD, wrow, 16 * kk);
      frag_a(va, sV, C::LD, wrow, 16 * kk);
#pragma unroll
      for (int jp = 0; jp < C::NT / 2; ++jp) {
        uint32_t b[4];
        frag_b_kmaj(b, q_s, C::LD, 16 * jp, 16 * kk);
        mma_pair(s[2 * jp], s[2 * jp + 1], ka, b);
        frag_b_kmaj(b, o_s, C::LD, 16 * jp, 16 * kk);
        mma_pair(dp[2 * jp], dp[2 * jp + 1], va, b);
      }
    }
    fold_elements<C::NT, C::TILE, C::BK>(s, dp, lse_s, del_s, p, f, t0, wrow);

    uint32_t ah[C::NT / 2][4], al[C::NT / 2][4];
    if (FP32_GRADS) {
      c_to_a_split<C::NT>(ah, al, s);
    } else {
      c_to_a<C::NT>(ah, s);
    }
#pragma unroll
    for (int jp = 0; jp < C::ND / 2; ++jp)
#pragma unroll
      for (int c = 0; c < C::NT / 2; ++c) {
        uint32_t b[4];
        frag_b_nmaj(b, o_s, C::LD, 16 * c, 16 * jp);
        mma_pair(dv[2 * jp], dv[2 * jp + 1], ah[c], b);
        if (FP32_GRADS) mma_pair(dv[2 * jp], dv[2 * jp + 1], al[c], b);
      }
    if (FP32_GRADS) {
      c_to_a_split<C::NT>(ah, al, dp);
    } else {
      c_to_a<C::NT>(ah, dp);
    }
#pragma unroll
    for (int jp = 0; jp < C::ND / 2; ++jp)
#pragma unroll
      for (int c = 0; c < C::NT / 2; ++c) {
        uint32_t b[4];
        frag_b_nmaj(b, q_s, C::LD, 16 * c, 16 * jp);
        mma_pair(dk[2 * jp], dk[2 * jp + 1], ah[c], b);
        if (FP32_GRADS) mma_pair(dk[2 * jp], dk[2 * jp + 1], al[c], b);
      }
  }

  store_fold_acc<C::ND>(dk, dv, p, f, wrow);
}

template <int DP, bool FP32_GRADS, int STAGES>
int launch_staged(const KvParams& p, int64_t n_work, cudaStream_t stream) {
  using C = KvCfg<DP, kFoldWarps, STAGES>;
  const int64_t grid = n_work * p.HKV;
  if (grid > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  constexpr auto kernel = dkdv_kernel<DP, kFoldWarps, FP32_GRADS, STAGES>;
  GS_TRY(dynamic_smem_once<kernel>(C::SMEM));
  kernel<<<static_cast<unsigned>(grid), C::THREADS, C::SMEM, stream>>>(p);
  return static_cast<int>(cudaGetLastError());
}

// head_dim 128: four stages (the program is held to two per SM by its 250 registers, so the deeper pipeline's
// 105 KB cost no occupancy; measured 839 -> 813 us for the 8 x 1024 step's fold, same bits); narrower heads:
// two stages, which keeps three programs per SM.
template <int DP, bool FP32_GRADS>
int launch_dkdv(const KvParams& p, int64_t n_work, cudaStream_t stream) {
  return launch_staged<DP, FP32_GRADS, DP == kMaxHeadDim ? 4 : 2>(p, n_work, stream);
}

template <int DP>
int launch_dkdv_dp(const KvParams& p, int64_t n_work, bool fp32_grads, cudaStream_t stream) {
  return fp32_grads ? launch_dkdv<DP, true>(p, n_work, stream) : launch_dkdv<DP, false>(p, n_work, stream);
}

}  // namespace attn

int attn_dkdv(uintptr_t k, uintptr_t v, uintptr_t q, uintptr_t dout, uintptr_t lse, uintptr_t delta, uintptr_t dk,
              uintptr_t dv, uintptr_t work, int64_t n_work, int64_t HQ, int64_t HKV, int64_t D, int64_t T,
              float qk_scale, float sm_scale, bool load_acc, bool fp32_grads, int device, uintptr_t stream,
              int path) {
  if (n_work == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  attn::KvParams p{};
  p.k = reinterpret_cast<const bf16*>(k);
  p.v = reinterpret_cast<const bf16*>(v);
  p.q = reinterpret_cast<const bf16*>(q);
  p.dout = reinterpret_cast<const bf16*>(dout);
  p.lse = reinterpret_cast<const float*>(lse);
  p.delta = reinterpret_cast<const float*>(delta);
  p.dk = reinterpret_cast<float*>(dk);
  p.dv = reinterpret_cast<float*>(dv);
  p.work = reinterpret_cast<const int32_t*>(work);
  p.G = static_cast<int>(HQ / HKV);
  p.HQ = HQ;
  p.HKV = HKV;
  p.D = D;
  p.T = T;
  p.qk_scale = qk_scale;
  p.sm_scale = sm_scale;
  p.load_acc = load_acc;
  p.vec_kv = aligned16(p.k) && aligned16(p.v) && D % 8 == 0;
  p.vec_q = aligned16(p.q) && aligned16(p.dout) && D % 8 == 0;
  p.pair_acc = D % 2 == 0 && (dk & 7u) == 0 && (dv & 7u) == 0;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  bool sm90 = false;  // the wgmma fold: the same bits, a speed choice
  GS_TRY(attn::wide_on_sm90(D, path, device, sm90));
  return attn::by_head_dim(D, sm90, [&](auto dp, bool wgmma) {
#ifndef GS_NO_SM90_GEMM
    if (wgmma) return attn::launch_dkdv_sm90(p, n_work, fp32_grads, s);
#endif
    return attn::launch_dkdv_dp<decltype(dp)::value>(p, n_work, fp32_grads, s);
  });
}

}  // namespace gs
