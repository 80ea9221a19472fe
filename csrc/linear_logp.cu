// Fused lm_head + selected-token log-prob without materialising [R, V] logits.
//
// Forward: CTA (row tile of 128, vocabulary chunk of kLlpVChunk columns) walks its chunk in blocks of 128
// columns; per block the tensor-core mainloop (mma_gemm.cuh) computes the logits tile, which is staged in
// shared memory as fp32, and one warp per row folds it into that row's running (max, sum of exp, target
// logit): lane l reads columns l, l + 32, l + 64, l + 96 in that order, then an xor butterfly. The launch
// configuration is a constant (it depends on nothing about R), so each row's reduction order is fixed.
// A second kernel combines the chunks' partials in chunk order, one thread per row.
//
// On Hopper (gemm_path): the logits of a vocabulary slab come from the CUTLASS fp32-out GEMM (llp_sm90.cu: the
// accumulator bits of the mainloop above) into a scratch, and llp_reduce_kernel, one warp per (row, chunk), runs
// the very reduction of llp_fwd_kernel on them (same blocks of 128 columns, same lane order, same butterfly,
// same online update), so both paths give the same bits; llp_dlogits likewise applies EpiDlogits' formula to
// the scratch (llp_dlogits_kernel).
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

// The per-row reduction of llp_fwd_kernel over logits in memory: warp w of the grid takes row w / cis and chunk
// w % cis of the slab that starts at vocabulary column v0 (a multiple of kLlpVChunk; cis chunks of kLlpVChunk
// columns, the last one cut at V); ldl: the scratch's row pitch (its column 0 is vocabulary column v0).
__global__ void __launch_bounds__(128) llp_reduce_kernel(const float* __restrict__ logits, int64_t ldl,
                                                         const int64_t* __restrict__ targets, float* __restrict__ part,
                                                         int64_t R, int64_t V, int64_t v0, int64_t cis,
                                                         int64_t n_chunks) {
  constexpr int kBlock = C::BN;
  const int lane = threadIdx.x & 31;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= R * cis) return;
  const int64_t row = w / cis;
  const int64_t chunk = v0 / kLlpVChunk + w % cis;
  const int64_t cb = chunk * kLlpVChunk;
  const int64_t ce = cb + kLlpVChunk < V ? cb + kLlpVChunk : V;
  const float* src = logits + row * ldl + (cb - v0);
  const int64_t t = targets[row];
  float m = -INFINITY, s = 0.0f, tgt = 0.0f;
  for (int64_t vb = cb; vb < ce; vb += kBlock) {
    float x[kBlock / 32];
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBlock / 32; ++j) {
      const int64_t col = vb + lane + 32 * j;
      x[j] = col < V ? src[col - cb] : -INFINITY;
      mx = fmaxf(mx, x[j]);
    }
    mx = warp_max(mx);
    const float m_new = fmaxf(m, mx);
    float se = 0.0f;
#pragma unroll
    for (int j = 0; j < kBlock / 32; ++j) {
      if (vb + lane + 32 * j < V) se = __fadd_rn(se, expf(__fsub_rn(x[j], m_new)));
    }
    se = warp_sum(se);
    s = __fadd_rn(__fmul_rn(s, expf(__fsub_rn(m, m_new))), se);
    m = m_new;
    if (t >= vb && t < vb + kBlock && t < V) tgt = __fadd_rn(tgt, src[t - cb]);
  }
  if (lane == 0) {
    part[(0 * n_chunks + chunk) * R + row] = m;
    part[(1 * n_chunks + chunk) * R + row] = s;
    part[(2 * n_chunks + chunk) * R + row] = tgt;
  }
}

// EpiDlogits' formula over logits in memory: d[r, c] = round_bf16(g_r (onehot(v0 + c == t_r) - exp(l - lse_r))),
// one element per thread of a grid-stride loop over the M x N elements.
__global__ void __launch_bounds__(256) llp_dlogits_kernel(const float* __restrict__ logits, int64_t ldl,
                                                          const int64_t* __restrict__ targets,
                                                          const float* __restrict__ lse, const float* __restrict__ g,
                                                          bf16* __restrict__ d, int64_t ldd, int64_t M, int64_t N,
                                                          int64_t v0, int64_t vocab) {
  const int64_t total = M * N;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / N, col = i - r * N;
    const int64_t t = targets[r];
    const float gr = (t >= 0 && t < vocab) ? g[r] : 0.0f;
    const float hot = (v0 + col == t) ? 1.0f : 0.0f;
    const float p = expf(__fsub_rn(logits[r * ldl + col], lse[r]));
    d[r * ldd + col] = __float2bfloat16_rn(__fmul_rn(gr, __fsub_rn(hot, p)));
  }
}

// The Hopper forward: slab after slab of ldl vocabulary columns, the CUTLASS fp32 logits, then llp_reduce_kernel
// (gemm_path picks it only in a build with the Hopper kernels).
int forward_sm90(uintptr_t hidden, uintptr_t weight, const int64_t* targets, float* part, int64_t R, int64_t V,
                 int64_t K, int64_t ldh, int64_t ldw, float* logits, int64_t ldl, int64_t n_chunks, int device,
                 uintptr_t stream) {
#ifdef GS_NO_SM90_GEMM
  return static_cast<int>(cudaErrorNotSupported);
#else
  for (int64_t v0 = 0; v0 < V; v0 += ldl) {
    const int64_t vc = ldl < V - v0 ? ldl : V - v0;
    if (const int e = gemm_sm90_nt_f32(hidden, weight + static_cast<uintptr_t>(v0 * ldw) * sizeof(bf16),
                                       reinterpret_cast<uintptr_t>(logits), R, vc, K, ldh, ldw, ldl, device, stream)) {
      return e;
    }
    const int64_t cis = (vc + kLlpVChunk - 1) / kLlpVChunk;
    const int64_t blocks = (R * cis + 3) / 4;
    if (blocks > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
    llp_reduce_kernel<<<static_cast<unsigned>(blocks), 128, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
        logits, ldl, targets, part, R, V, v0, cis, n_chunks);
    GS_TRY(cudaGetLastError());
  }
  return 0;
#endif
}

// The Hopper dlogits: the CUTLASS fp32 logits of the chunk, then llp_dlogits_kernel.
int dlogits_sm90(uintptr_t hidden, uintptr_t weight, const int64_t* targets, const float* lse, const float* g,
                 bf16* d, int64_t M, int64_t N, int64_t K, int64_t v0, int64_t V, int64_t ldh, int64_t ldw,
                 int64_t ldd, float* logits, int64_t ldl, int device, uintptr_t stream) {
#ifdef GS_NO_SM90_GEMM
  return static_cast<int>(cudaErrorNotSupported);
#else
  if (const int e = gemm_sm90_nt_f32(hidden, weight, reinterpret_cast<uintptr_t>(logits), M, N, K, ldh, ldw, ldl,
                                     device, stream)) {
    return e;
  }
  const int64_t blocks = (M * N + 255) / 256 < 65536 ? (M * N + 255) / 256 : 65536;
  llp_dlogits_kernel<<<static_cast<unsigned>(blocks), 256, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      logits, ldl, targets, lse, g, d, ldd, M, N, v0, V);
  return static_cast<int>(cudaGetLastError());
#endif
}

}  // namespace

int llp_forward(uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t part, uintptr_t out, uintptr_t lse,
                int64_t R, int64_t V, int64_t K, int64_t ldh, int64_t ldw, uintptr_t logits, int64_t ldl, int device,
                uintptr_t stream, int path) {
  if (R == 0 || V == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* hp = reinterpret_cast<const bf16*>(hidden);
  const auto* wp = reinterpret_cast<const bf16*>(weight);
  const int64_t n_chunks = (V + kLlpVChunk - 1) / kLlpVChunk;
  const int64_t num_m = (R + C::BM - 1) / C::BM;
  if (num_m * n_chunks > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  const bool vec_h = mma::vec_ok(hp, ldh), vec_w = mma::vec_ok(wp, ldw);
  auto* lp = reinterpret_cast<float*>(logits);
  // TMA stores whole 16-byte chunks of a row: every slab's width (ldl, and the last one's V mod ldl) a multiple of
  // 4 floats, else the mma.sync kernel (same bits).
  const bool scratch = lp != nullptr && ldl > 0 && ldl % kLlpVChunk == 0 && V % 4 == 0 && K % 8 == 0 &&
                       mma::vec_ok(lp, ldl);
  const int sm90 = gemm_path(path, vec_h && vec_w && scratch, R, ldl < V ? ldl : V, K, device);
  if (sm90 < 0) return -sm90;
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const auto* tp = reinterpret_cast<const int64_t*>(targets);
  auto* pp = reinterpret_cast<float*>(part);
  if (sm90 == 1) {
    if (const int e = forward_sm90(hidden, weight, tp, pp, R, V, K, ldh, ldw, lp, ldl, n_chunks, device, stream)) {
      return e;
    }
  } else {
    const mma::GemmArgs g{hp, ldh, wp, ldw, R, V, K, nullptr, vec_h, vec_w};
    GS_TRY(dynamic_smem_once<llp_fwd_kernel>(kFwdSmem));
    llp_fwd_kernel<<<static_cast<unsigned>(num_m * n_chunks), C::THREADS, kFwdSmem, s>>>(g, tp, pp, n_chunks);
    GS_TRY(cudaGetLastError());
  }
  llp_combine_kernel<<<static_cast<unsigned>((R + 127) / 128), 128, 0, s>>>(
      pp, tp, reinterpret_cast<float*>(out), reinterpret_cast<float*>(lse), R, V, n_chunks);
  return static_cast<int>(cudaGetLastError());
}

int llp_dlogits(uintptr_t hidden, uintptr_t weight, uintptr_t targets, uintptr_t lse, uintptr_t g, uintptr_t d,
                int64_t M, int64_t N, int64_t K, int64_t v0, int64_t V, int64_t ldh, int64_t ldw, int64_t ldd,
                uintptr_t logits, int64_t ldl, int device, uintptr_t stream, int path) {
  if (M == 0 || N == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* hp = reinterpret_cast<const bf16*>(hidden);
  const auto* wp = reinterpret_cast<const bf16*>(weight);
  const bool vec_h = mma::vec_ok(hp, ldh), vec_w = mma::vec_ok(wp, ldw);
  auto* lp = reinterpret_cast<float*>(logits);
  const bool scratch = lp != nullptr && ldl >= N && N % 4 == 0 && K % 8 == 0 && mma::vec_ok(lp, ldl);  // (as above)
  const int sm90 = gemm_path(path, vec_h && vec_w && scratch, M, N, K, device);
  if (sm90 < 0) return -sm90;
  const auto* tp = reinterpret_cast<const int64_t*>(targets);
  const auto* lsep = reinterpret_cast<const float*>(lse);
  const auto* gp = reinterpret_cast<const float*>(g);
  auto* dp = reinterpret_cast<bf16*>(d);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (sm90 == 1) return dlogits_sm90(hidden, weight, tp, lsep, gp, dp, M, N, K, v0, V, ldh, ldw, ldd, lp, ldl, device,
                                     stream);
  const mma::GemmArgs ga{hp, ldh, wp, ldw, M, N, K, nullptr, vec_h, vec_w};
  const mma::EpiDlogits epi{dp, ldd, tp, lsep, gp, v0, V};
  return mma::launch_by_m<true, true>(ga, epi, s);
}

}  // namespace gs
