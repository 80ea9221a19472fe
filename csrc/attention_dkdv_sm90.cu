// The dK / dV fold on Hopper tensor cores (sm_90a): the mma.sync fold of attention_dkdv.cu with its products
// issued as warpgroup MMAs, for head_dim 65 .. 128.
//
// Why: under Nsight Compute the mma.sync fold is instruction-bound (notes/kernels_cuda.md, tenth session): per
// 32-query tile each of its four warps issues 192 mma.sync plus the ldmatrix fragment loads of every operand. Here
// the program's four warps are one warpgroup and a tile takes 24 wgmma instructions (S^T and dP^T: 8 k16 steps of
// m64n32 each, from shared memory; dV and dK: 2 k16 steps x hi / lo of m64n128, P^T and dS^T from registers, dO and
// Q read transposed from the same shared tiles), with no fragment loads at all.
//
// Why the bits are the mma.sync fold's: the program, its keys, its tiles and its loop order are the same; an
// accumulator element receives the same k16 steps in the same order (S^T, dP^T: head_dim in 16-steps; dV, dK: per
// 16 queries hi then lo, queries in position order), from the same FP32 start (zero, or the loaded main grad), and
// wgmma's FP32 accumulation of a k16 step equals mma.sync's (the dW fold's GPU test showed it for the GEMMs; the
// attention GPU tests compare this kernel's bits with the mma.sync kernel's). The element work (P^T, dS^T, masks,
// hi / lo splits) is the shared code of attention_dkdv.cuh on the same accumulator layout. So which of the two
// kernels runs is a speed choice: a layout never picks the kernel (head_dim and the GPU do).
//
// Shared memory: K, V (64 keys) and STAGES stages of Q, dO (32 queries) as 128-byte-swizzled K-major tiles (two
// 64-column halves of rows of 128 bytes; 16-byte chunk c of row r at chunk c ^ (r % 8)), the layout wgmma reads:
// as K-major operands for S^T = K Q^T and dP^T = V dO^T, and, the same bytes, as MN-major B operands (dO, Q with
// k = query) of dV += P^T dO and dK += dS^T Q. The pipeline is the mma.sync fold's (wait, fence for the async proxy,
// barrier, issue tile it + STAGES - 1), its Q / dO tiles loaded by TMA where a tile is whole (one thread issues
// four boxes that complete on the stage's barrier; measured: the cp.async issue of 16 KB a tile by every thread
// held the fold back, notes/kernels_cuda.md), by cp.async with zero rows for a sample's last, short tile (TMA
// would read the next sample's rows there): the same bytes at the same addresses either way. K, V, lse and delta
// stay on cp.async (once a program, and 256 bytes a tile).
#include <cstdint>
#include <utility>

#include "attention_dkdv.cuh"
#include "attention_sm90.cuh"
#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cutlass/arch/barrier.h"

namespace gs {
namespace attn {
namespace {

namespace gmma = cute::SM90::GMMA;
using sm90::fence_regs;
using sm90::kDP;
using sm90::kmajor;
using sm90::mnmajor;

constexpr int kBK = kFoldWarps * 16;    // 64 keys: one warpgroup's m64
constexpr int kTile = kFoldTile;        // 32 queries: wgmma's n32 of S^T and dP^T
constexpr int kThreads = kFoldWarps * 32;
constexpr int kStages = 4;
constexpr int kNT = kTile / 8, kND = kDP / 8, kKS = kDP / 16;
constexpr int kKvBytes = kBK * kDP * 2, kQBytes = kTile * kDP * 2;
// + alignment slack; then K, V, the Q / dO stages, lse / delta, one "full" barrier a stage
constexpr int kSmem = 1024 + 2 * kKvBytes + 2 * kStages * kQBytes + 2 * kStages * kTile * 4 + kStages * 8;
using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
static_assert(kFoldWarps == 4 && kTile == 32 && kDP == 128, "the wgmma shapes below assume these");

template <size_t... I>
__device__ __forceinline__ void wgmma_s(uint64_t a, uint64_t b, float (&d)[kNT][4], std::index_sequence<I...>) {
  gmma::MMA_64x32x16_F32BF16BF16_SS<gmma::Major::K, gmma::Major::K>::fma(a, b, d[I / 4][I % 4]...,
                                                                       gmma::ScaleOut::One);
}
template <size_t... I>
__device__ __forceinline__ void wgmma_acc(const uint32_t (&a)[4], uint64_t b, float (&d)[kND][4],
                                          std::index_sequence<I...>) {
  gmma::MMA_64x128x16_F32BF16BF16_RS<gmma::Major::K, gmma::Major::MN>::fma(a[0], a[1], a[2], a[3], b,
                                                                         d[I / 4][I % 4]..., gmma::ScaleOut::One);
}
// acc += A B over one tile's kTile queries (dV += P^T dO, dK += dS^T Q): per 16 queries one wgmma of the hi operand
// and, with fp32 grads, one of the lo operand (c_to_a_split), B the store tile read MN-major. One batch, committed
// and not waited (the caller overlaps it with the next element step).
template <bool FP32_GRADS>
__device__ __forceinline__ void fold_product(const uint32_t (&hi)[kNT / 2][4], const uint32_t (&lo)[kNT / 2][4],
                                             const unsigned char* tile, float (&acc)[kND][4]) {
  fence_regs(acc);
  cute::warpgroup_arrive();
#pragma unroll
  for (int c = 0; c < kNT / 2; ++c) {
    wgmma_acc(hi[c], mnmajor<kTile>(tile, c), acc, std::make_index_sequence<kND * 4>{});
    if (FP32_GRADS) wgmma_acc(lo[c], mnmajor<kTile>(tile, c), acc, std::make_index_sequence<kND * 4>{});
  }
  cute::warpgroup_commit_batch();
}

template <bool FP32_GRADS>
__global__ void __launch_bounds__(kThreads, 2) dkdv_sm90_kernel(KvParams p, bool tma,
                                                                 const __grid_constant__ CUtensorMap tma_q,
                                                                 const __grid_constant__ CUtensorMap tma_do) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sK = sm90::align1024(smem_raw);
  unsigned char* sV = sK + kKvBytes;
  unsigned char* sQ = sV + kKvBytes;            // [kStages] tiles
  unsigned char* sO = sQ + kStages * kQBytes;   // dO, [kStages] tiles
  float* sLse = reinterpret_cast<float*>(sO + kStages * kQBytes);
  float* sDel = sLse + kStages * kTile;
  uint64_t* full = reinterpret_cast<uint64_t*>(sDel + kStages * kTile);
  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) FullBarrier::init(full + st, 1);
    cutlass::arch::fence_barrier_init();
    if (tma) {
      cute::prefetch_tma_descriptor(&tma_q);
      cute::prefetch_tma_descriptor(&tma_do);
    }
  }
  __syncthreads();

  const FoldProgram f(p, kTile);
  sm90::load_sw128<kBK, kThreads>(sK, [&](int r) { return f.key_row(p, p.k, r); }, p.D, p.vec_kv);
  sm90::load_sw128<kBK, kThreads>(sV, [&](int r) { return f.key_row(p, p.v, r); }, p.D, p.vec_kv);

  const int n_tiles = f.n_tiles;
  const int n_it = p.G * n_tiles;  // (head of the group, tile), heads outer
  auto load_tile_q = [&](int it, int stage) {
    const int g = it / n_tiles;
    const int t0 = f.t_first + (it - g * n_tiles) * kTile;
    const int64_t hq = f.hk * p.G + g;
    if (tma && t0 + kTile <= f.L) {
      if (threadIdx.x == 0) {
        FullBarrier::arrive_and_expect_tx(full + stage, 2 * kQBytes);
        sm90::tma_rows<kTile>(&tma_q, full + stage, sQ + stage * kQBytes, hq, f.tok_base + t0);
        sm90::tma_rows<kTile>(&tma_do, full + stage, sO + stage * kQBytes, hq, f.tok_base + t0);
      }
    } else {
      sm90::load_sw128<kTile, kThreads>(sQ + stage * kQBytes,
                                        [&](int r) { return f.query_row(p, p.q, hq, t0 + r); }, p.D, p.vec_q);
      sm90::load_sw128<kTile, kThreads>(sO + stage * kQBytes,
                                        [&](int r) { return f.query_row(p, p.dout, hq, t0 + r); }, p.D, p.vec_q);
      if (threadIdx.x == 0) FullBarrier::arrive(full + stage);  // the phase completes; cp.async is waited below
    }
    load_lse_delta<kTile, kThreads>(sLse + stage * kTile, sDel + stage * kTile, p, f, hq, t0);
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < n_it) load_tile_q(st, st);
    mma::cp_async_commit();
  }

  const int wrow = static_cast<int>(threadIdx.x >> 5) * 16;
  float dk[kND][4], dv[kND][4];
  load_fold_acc<kND>(dk, dv, p, f, wrow);  // the main grad, loaded before the fold

  for (int it = 0; it < n_it; ++it) {
    mma::cp_async_wait<kStages - 2>();
    cutlass::arch::fence_view_async_shared();  // this thread's cp.async writes, visible to wgmma's async proxy
    const int st = it % kStages;
    FullBarrier::wait(full + st, static_cast<uint32_t>((it / kStages) & 1));  // its TMA bytes, where it had any
    __syncthreads();  // tile it is in shared memory; every warp is done with tile it - 1 (its stage is free)
    if (it + kStages - 1 < n_it) load_tile_q(it + kStages - 1, (it + kStages - 1) % kStages);
    mma::cp_async_commit();
    const unsigned char* q_s = sQ + st * kQBytes;
    const unsigned char* o_s = sO + st * kQBytes;
    const int t0 = f.t_first + (it % n_tiles) * kTile;

    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = 0.0f;
        dp[j][e] = 0.0f;
      }
    fence_regs(s);
    fence_regs(dp);
    // Four batches, each element step overlapping the tensor cores' next batch: S^T and dP^T issued; P^T once S^T
    // has landed (dP^T still running); dV issued; dS^T once dP^T has landed (dV running); dK issued.
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk)
      wgmma_s(kmajor<kBK>(sK, kk), kmajor<kTile>(q_s, kk), s, std::make_index_sequence<kNT * 4>{});
    cute::warpgroup_commit_batch();
#pragma unroll
    for (int kk = 0; kk < kKS; ++kk)
      wgmma_s(kmajor<kBK>(sV, kk), kmajor<kTile>(o_s, kk), dp, std::make_index_sequence<kNT * 4>{});
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();  // S^T
    fence_regs(s);

    fold_p<kNT, kTile, kBK>(s, sLse + st * kTile, p, f, t0, wrow);
    uint32_t ph[kNT / 2][4], pl[kNT / 2][4], dh[kNT / 2][4], dl[kNT / 2][4];
    if (FP32_GRADS) {
      c_to_a_split<kNT>(ph, pl, s);
    } else {
      c_to_a<kNT>(ph, s);
    }
    fold_product<FP32_GRADS>(ph, pl, o_s, dv);  // dV += P^T dO
    cute::warpgroup_wait<1>();  // dP^T (dV may still run)
    fence_regs(dp);

    fold_ds<kNT, kTile, kBK>(s, dp, sDel + st * kTile, p, f, t0, wrow);
    if (FP32_GRADS) {
      c_to_a_split<kNT>(dh, dl, dp);
    } else {
      c_to_a<kNT>(dh, dp);
    }
    fold_product<FP32_GRADS>(dh, dl, q_s, dk);  // dK += dS^T Q
    cute::warpgroup_wait<0>();  // the stage is read by the time the next iteration's barrier frees it
    fence_regs(dv);
    fence_regs(dk);
  }
  store_fold_acc<kND>(dk, dv, p, f, wrow);
}

template <bool FP32_GRADS>
int launch(const KvParams& p, int64_t n_work, cudaStream_t stream) {
  const int64_t grid = n_work * p.HKV;
  if (grid > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  constexpr auto kernel = dkdv_sm90_kernel<FP32_GRADS>;
  GS_TRY(dynamic_smem_once<kernel>(kSmem));
  CUtensorMap tma_q{}, tma_do{};
  const bool tma = sm90::encode_store(&tma_q, p.q, p.T, p.HQ, p.D, kTile) &&
                   sm90::encode_store(&tma_do, p.dout, p.T, p.HQ, p.D, kTile);
  kernel<<<static_cast<unsigned>(grid), kThreads, kSmem, stream>>>(p, tma, tma_q, tma_do);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int launch_dkdv_sm90(const KvParams& p, int64_t n_work, bool fp32_grads, cudaStream_t stream) {
  return fp32_grads ? launch<true>(p, n_work, stream) : launch<false>(p, n_work, stream);
}

}  // namespace attn
}  // namespace gs
