// Fused lm_head + selected-token log-prob without materialising [R, V] logits.
//
// Forward: CTA (row tile of 128, vocabulary chunk of kLlpVChunk columns) walks its chunk in blocks of 128
// columns; per block the tensor-core mainloop (mma_gemm.cuh) computes the logits tile, which is staged in
// shared memory as fp32, and one warp per row folds it into that row's running (max, sum of exp, target
// logit): lane l reads columns l, l + 32, l + 64, l + 96 in that order, then an xor butterfly. The launch
// configuration is a constant (it depends on nothing about R), so each row's reduction order is fixed.
// A second kernel combines the chunks' partials in chunk order, one thread per row.
//
// Backward (driven from Python, chunk by chunk over V): llp_dlogits recomputes the logits of a vocabulary
// chunk and applies dlogits = g (onehot - exp(logit - lse)) element-wise, in bf16; dhidden and dW then go
// through gemm_nn (fp32 accumulate) and gemm_dw_fold.
#include "gemm_epilogue.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

using C = mma::CfgLarge;
constexpr int kTilePitch = C::BN + 4;  // fp32 logits tile row pitch in shared memory
constexpr int kPipeBytes = mma::Smem<C, true, true>::BYTES;
constexpr int kTileBytes = C::BM * kTilePitch * 4;
constexpr int kFwdSmem = kPipeBytes > kTileBytes ? kPipeBytes : kTileBytes;
static_assert(kLlpVChunk % C::BN == 0, "a vocabulary chunk is a whole number of blocks");

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// part: [3][n_chunks][R] = running max, sum of exp(logit - max), target logit (0 when the target is elsewhere).
__global__ void __launch_bounds__(C::THREADS, 1) llp_fwd_kernel(mma::GemmArgs g, const int64_t* __restrict__ targets,
                                                             float* __restrict__ part, int64_t n_chunks) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ float s_max[C::BM], s_sum[C::BM], s_tgt[C::BM];
  const int64_t R = g.M, V = g.N;
  const int64_t num_m = (R + C::BM - 1) / C::BM;
  const int64_t m0 = (blockIdx.x % num_m) * C::BM;  // row tiles fastest: neighbours share the chunk's rows of W
  const int64_t chunk = blockIdx.x / num_m;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  constexpr int kWarps = C::THREADS / 32;
  for (int r = threadIdx.x; r < C::BM; r += C::THREADS) {
    s_max[r] = -INFINITY;
    s_sum[r] = 0.0f;
    s_tgt[r] = 0.0f;
  }
  float* tile = reinterpret_cast<float*>(smem_raw);
  const int64_t v_end = (chunk + 1) * kLlpVChunk < V ? (chunk + 1) * kLlpVChunk : V;
  for (int64_t vb = chunk * kLlpVChunk; vb < v_end; vb += C::BN) {
    float acc[C::MI][C::NJ][4];
#pragma unroll
    for (int i = 0; i < C::MI; ++i)
#pragma unroll
      for (int j = 0; j < C::NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
    mma::mainloop<C, true, true>(acc, g, m0, vb, reinterpret_cast<bf16*>(smem_raw));  // ends in a barrier
    const mma::Frag<C> f;
#pragma unroll
    for (int i = 0; i < C::MI; ++i)
#pragma unroll
      for (int j = 0; j < C::NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) tile[f.row(i, e) * kTilePitch + f.col(j, e)] = acc[i][j][e];
    __syncthreads();
    for (int r = warp; r < C::BM; r += kWarps) {
      float x[C::BN / 32];
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < C::BN / 32; ++j) {
        const int col = lane + 32 * j;
        x[j] = vb + col < V ? tile[r * kTilePitch + col] : -INFINITY;
        mx = fmaxf(mx, x[j]);
      }
      mx = warp_max(mx);
      const float m_old = s_max[r];
      const float m_new = fmaxf(m_old, mx);
      float se = 0.0f;
#pragma unroll
      for (int j = 0; j < C::BN / 32; ++j) {
        if (vb + lane + 32 * j < V) se = __fadd_rn(se, expf(__fsub_rn(x[j], m_new)));
      }
      se = warp_sum(se);
      if (lane == 0) {
        s_sum[r] = __fadd_rn(__fmul_rn(s_sum[r], expf(__fsub_rn(m_old, m_new))), se);
        s_max[r] = m_new;
        if (m0 + r < R) {
          const int64_t t = targets[m0 + r];
          if (t >= vb && t < vb + C::BN && t < V) s_tgt[r] = __fadd_rn(s_tgt[r], tile[r * kTilePitch + (t - vb)]);
        }
      }
    }
    __syncthreads();  // the tile region is the next mainloop's pipeline
  }
  for (int r = threadIdx.x; r < C::BM; r += C::THREADS) {
    const int64_t row = m0 + r;
    if (row >= R) continue;
    part[(0 * n_chunks + chunk) * R + row] = s_max[r];
    part[(1 * n_chunks + chunk) * R + row] = s_sum[r];
    part[(2 * n_chunks + chunk) * R + row] = s_tgt[r];
  }
}

__global__ void __launch_bounds__(128) llp_combine_kernel(const float* __restrict__ part,
                                                          const int64_t* __restrict__ targets,
                                                          float* __restrict__ out, float* __restrict__ lse_out,
                                                          int64_t R, int64_t V, int64_t n_chunks) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= R) return;
  float m = -INFINITY, s = 0.0f, xt = 0.0f;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const float mc = part[(0 * n_chunks + c) * R + r];
    const float sc = part[(1 * n_chunks + c) * R + r];
    const float m_new = fmaxf(m, mc);
    s = __fadd_rn(__fmul_rn(s, expf(__fsub_rn(m, m_new))), __fmul_rn(sc, expf(__fsub_rn(mc, m_new))));
    m = m_new;
    xt = __fadd_rn(xt, part[(2 * n_chunks + c) * R + r]);
  }
  const float lse = __fadd_rn(m, logf(s));
  const int64_t t = targets[r];
  out[r] = (t >= 0 && t < V) ? __fsub_rn(xt, lse) : 0.0f;
  lse_out[r] = lse;
}

}  // namespace

int llp_forward(uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t part, uintptr_t out, uintptr_t lse,
                int64_t R, int64_t V, int64_t K, int64_t ldh, int64_t ldw, int device, uintptr_t stream) {
  if (R == 0 || V == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* hp = reinterpret_cast<const bf16*>(hidden);
  const auto* wp = reinterpret_cast<const bf16*>(weight);
  const int64_t n_chunks = (V + kLlpVChunk - 1) / kLlpVChunk;
  const int64_t num_m = (R + C::BM - 1) / C::BM;
  if (num_m * n_chunks > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  const mma::GemmArgs g{hp, ldh, wp, ldw, R, V, K, nullptr, mma::vec_ok(hp, ldh), mma::vec_ok(wp, ldw)};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  GS_TRY(cudaFuncSetAttribute(llp_fwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kFwdSmem));
  const auto* tp = reinterpret_cast<const int64_t*>(targets);
  auto* pp = reinterpret_cast<float*>(part);
  llp_fwd_kernel<<<static_cast<unsigned>(num_m * n_chunks), C::THREADS, kFwdSmem, s>>>(g, tp, pp, n_chunks);
  GS_TRY(cudaGetLastError());
  llp_combine_kernel<<<static_cast<unsigned>((R + 127) / 128), 128, 0, s>>>(
      pp, tp, reinterpret_cast<float*>(out), reinterpret_cast<float*>(lse), R, V, n_chunks);
  return static_cast<int>(cudaGetLastError());
}

int llp_dlogits(uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t lse, uintptr_t g, uintptr_t d,
                int64_t M, int64_t N, int64_t K, int64_t v0, int64_t V, int64_t ldh, int64_t ldw, int64_t ldd,
                int device, uintptr_t stream) {
  if (M == 0 || N == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* hp = reinterpret_cast<const bf16*>(hidden);
  const auto* wp = reinterpret_cast<const bf16*>(weight);
  const mma::GemmArgs ga{hp, ldh, wp, ldw, M, N, K, nullptr, mma::vec_ok(hp, ldh), mma::vec_ok(wp, ldw)};
  const mma::EpiDlogits epi{reinterpret_cast<bf16*>(d), ldd, reinterpret_cast<const int64_t*>(targets),
                            reinterpret_cast<const float*>(lse), reinterpret_cast<const float*>(g), v0, V};
  return mma::launch_by_m<true, true>(ga, epi, reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace gs
