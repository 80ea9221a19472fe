// Epilogues of the tensor-core GEMM (mma_gemm.cuh) and the kernel template that runs mainloop + epilogue.
//
// Every epilogue is element-wise on the fp32 accumulators (a row's outputs depend on that row alone):
//   EpiBf16    C = round_bf16(acc)                      (forward, dX)
//   EpiF32Acc  C = acc, acc LOADED from C before the mainloop (canonical dW fold, fp32 accumulation chains)
//   EpiF32Add  C = C + acc, acc from zero, one rounding (what CUTLASS's beta = 1 epilogue computes: sums of products)
//   EpiDlogits D = round_bf16(g (onehot(v0 + col == t) - exp(acc - lse)))   (linear_logp backward)
#pragma once

#include "mma_gemm.cuh"

namespace gs {
namespace mma {

template <class C>
using Acc = float[C::MI][C::NJ][4];

struct EpiBf16 {
  bf16* c;
  int64_t ldc;
  bool pair_ok;  // ldc even and c 4-byte aligned: two neighbouring columns stored as one bf16x2

  template <class C>
  __device__ __forceinline__ void init(Acc<C>& acc, int64_t, int64_t, int64_t, int64_t) const {
#pragma unroll
    for (int i = 0; i < C::MI; ++i)
#pragma unroll
      for (int j = 0; j < C::NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  }

  template <class C>
  __device__ __forceinline__ void store(const Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    const Frag<C> f;
#pragma unroll
    for (int i = 0; i < C::MI; ++i)
#pragma unroll
      for (int j = 0; j < C::NJ; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t r = m0 + f.row(i, 2 * h);
          const int64_t col = n0 + f.col(j, 0);
          if (r >= M || col >= N) continue;
          bf16* p = c + r * ldc + col;
          if (pair_ok && col + 1 < N) {
            *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
          } else {
            p[0] = __float2bfloat16_rn(acc[i][j][2 * h]);
            if (col + 1 < N) p[1] = __float2bfloat16_rn(acc[i][j][2 * h + 1]);
          }
        }
  }
};

// fn(acc element, its fp32 output) for every accumulator element whose (row, column) lies inside the M x N output
// (the element-wise fp32 epilogues share this one walk of the fragment).
template <class C, class Fn>
__device__ __forceinline__ void for_each_in_bounds(float* c, int64_t ldc, int64_t m0, int64_t n0, int64_t M,
                                                   int64_t N, Fn&& fn) {
  const Frag<C> f;
#pragma unroll
  for (int i = 0; i < C::MI; ++i)
#pragma unroll
    for (int j = 0; j < C::NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = m0 + f.row(i, e);
        const int64_t col = n0 + f.col(j, e);
        if (r < M && col < N) fn(i, j, e, c[r * ldc + col]);
      }
}

struct EpiF32Acc {
  float* c;
  int64_t ldc;

  template <class C>
  __device__ __forceinline__ void init(Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    EpiBf16{}.init<C>(acc, m0, n0, M, N);  // zero where the output ends
    for_each_in_bounds<C>(c, ldc, m0, n0, M, N,
                          [&](int i, int j, int e, float& out) { acc[i][j][e] = out; });  // the main grad, first
  }

  template <class C>
  __device__ __forceinline__ void store(const Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    for_each_in_bounds<C>(c, ldc, m0, n0, M, N, [&](int i, int j, int e, float& out) { out = acc[i][j][e]; });
  }
};

struct EpiF32Add {
  float* c;
  int64_t ldc;

  template <class C>
  __device__ __forceinline__ void init(Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    EpiBf16{}.init<C>(acc, m0, n0, M, N);
  }

  template <class C>
  __device__ __forceinline__ void store(const Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    for_each_in_bounds<C>(c, ldc, m0, n0, M, N,
                          [&](int i, int j, int e, float& out) { out = __fadd_rn(out, acc[i][j][e]); });
  }
};

struct EpiDlogits {
  bf16* d;
  int64_t ldd;
  const int64_t* targets;
  const float* lse;
  const float* g;
  int64_t v0, vocab;

  template <class C>
  __device__ __forceinline__ void init(Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    EpiBf16{}.init<C>(acc, m0, n0, M, N);
  }

  template <class C>
  __device__ __forceinline__ void store(const Acc<C>& acc, int64_t m0, int64_t n0, int64_t M, int64_t N) const {
    const Frag<C> f;
#pragma unroll
    for (int i = 0; i < C::MI; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = m0 + f.row(i, 2 * h);
        if (r >= M) continue;
        const int64_t t = targets[r];
        const float gr = (t >= 0 && t < vocab) ? g[r] : 0.0f;
        const float l = lse[r];
#pragma unroll
        for (int j = 0; j < C::NJ; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int64_t col = n0 + f.col(j, e);
            if (col >= N) continue;
            const float hot = (v0 + col == t) ? 1.0f : 0.0f;
            const float p = expf(__fsub_rn(acc[i][j][2 * h + e], l));
            d[r * ldd + col] = __float2bfloat16_rn(__fmul_rn(gr, __fsub_rn(hot, p)));
          }
      }
  }
};

template <class C, bool A_KMAJ, bool B_KMAJ, class Epi>
__global__ void __launch_bounds__(C::THREADS, 1) gemm_kernel(GemmArgs g, Epi epi) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  int64_t pm, pn;
  tile_ids(blockIdx.x, (g.M + C::BM - 1) / C::BM, (g.N + C::BN - 1) / C::BN, &pm, &pn);
  const int64_t m0 = pm * C::BM;
  const int64_t n0 = pn * C::BN;
  float acc[C::MI][C::NJ][4];
  epi.template init<C>(acc, m0, n0, g.M, g.N);
  mainloop<C, A_KMAJ, B_KMAJ>(acc, g, m0, n0, reinterpret_cast<bf16*>(smem_raw));
  epi.template store<C>(acc, m0, n0, g.M, g.N);
}

// Launch gemm_kernel<C, ...> over every output tile (raises the dynamic shared-memory limit first).
template <class C, bool A_KMAJ, bool B_KMAJ, class Epi>
int launch_gemm(const GemmArgs& g, const Epi& epi, cudaStream_t stream) {
  if (g.M == 0 || g.N == 0) return 0;
  const int64_t tiles = ((g.M + C::BM - 1) / C::BM) * ((g.N + C::BN - 1) / C::BN);
  if (tiles > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  constexpr int bytes = Smem<C, A_KMAJ, B_KMAJ>::BYTES;
  constexpr auto kernel = gemm_kernel<C, A_KMAJ, B_KMAJ, Epi>;
  GS_TRY(dynamic_smem_once<kernel>(bytes));
  kernel<<<static_cast<unsigned>(tiles), C::THREADS, bytes, stream>>>(g, epi);
  return static_cast<int>(cudaGetLastError());
}

// Tile configurations chosen by M (a speed choice only: see mma_gemm.cuh for why the bits do not follow it).
using CfgSmall = Cfg<16, 32, 128, 16, 16, 4>;   // M <= 16: many CTAs streaming the weight
using CfgMedium = Cfg<64, 128, 32, 32, 64, 4>;  // M <= 256
using CfgLarge = Cfg<128, 128, 32, 64, 32, 4>;  // larger M

template <bool A_KMAJ, bool B_KMAJ, class Epi>
int launch_by_m(const GemmArgs& g, const Epi& epi, cudaStream_t stream) {
  if (g.M <= 16) return launch_gemm<CfgSmall, A_KMAJ, B_KMAJ>(g, epi, stream);
  if (g.M <= 256) return launch_gemm<CfgMedium, A_KMAJ, B_KMAJ>(g, epi, stream);
  return launch_gemm<CfgLarge, A_KMAJ, B_KMAJ>(g, epi, stream);
}

inline bool vec_ok(const void* p, int64_t ld) { return aligned16(p) && ld % 8 == 0; }

}  // namespace mma
}  // namespace gs
