// QK-norm dweight: the canonical per-tile sums of a per-head RMSNorm whose weight [D] is shared by all heads.
//
// Forward and dx are rms_norm's row kernels on [R * heads, D] (one row per (token, head)). dweight follows
// the canonical protocol: partial[t, :] = sum over the tile's tokens j (slot order) of sum over heads h
// (head order) of dy[p, h, :] * (x[p, h, :] * rstd[p, h]), -1 slots skipped; rms_norm.cu's fold_tiles then
// adds the partials tile after tile into the loaded main grad.
#include "common.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 4;

template <bool ALIGNED>
__global__ void __launch_bounds__(kThreads) qk_dw_tiles_kernel(const int32_t* __restrict__ plan, int64_t tile,
                                                               const bf16* __restrict__ dy,
                                                               const bf16* __restrict__ x,
                                                               const float* __restrict__ rstd,
                                                               float* __restrict__ partial, int64_t heads,
                                                               int64_t D) {
  const int64_t t = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;  // columns are independent
  if (8 * v >= D) return;
  const int32_t* p = plan + t * tile;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
  // (token slot j, head h) pairs in the order q = j * heads + h; kUnroll pairs loaded ahead of their adds.
  const int64_t nq = tile * heads;
  for (int64_t q0 = 0; q0 < nq; q0 += kUnroll) {
    uint4 xv[kUnroll], gv[kUnroll];
    float r[kUnroll];
    bool live[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = q0 + u;
      const int64_t j = q / heads;
      const int32_t idx = q < nq ? __ldg(p + j) : -1;
      live[u] = idx >= 0;  // -1: a zero row, nothing is loaded
      const int64_t row = live[u] ? static_cast<int64_t>(idx) * heads + (q - j * heads) : 0;
      xv[u] = live[u] ? load_chunk<ALIGNED>(x + row * D, v, D) : make_uint4(0u, 0u, 0u, 0u);
      gv[u] = live[u] ? load_chunk<ALIGNED>(dy + row * D, v, D) : make_uint4(0u, 0u, 0u, 0u);
      r[u] = live[u] ? __ldg(rstd + row) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!live[u]) continue;
      float f[8], g[8];
      unpack8(xv[u], f);
      unpack8(gv[u], g);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fmaf_rn(g[e], __fmul_rn(f[e], r[u]), acc[e]);
    }
  }
  float* out = partial + t * D;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (8 * v + e < D) out[8 * v + e] = acc[e];
  }
}

}  // namespace

int qk_norm_dw_tiles(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t rstd,
                     uintptr_t partial, int64_t heads, int64_t head_dim, int device, uintptr_t stream) {
  if (n_tiles == 0 || head_dim == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* gp = reinterpret_cast<const bf16*>(dy);
  const auto* xp = reinterpret_cast<const bf16*>(x);
  const bool al = head_dim % 8 == 0 && aligned16(gp) && aligned16(xp);
  const int64_t nvec = (head_dim + 7) / 8;
  const int threads = nvec >= kThreads ? kThreads : static_cast<int>((nvec + 31) / 32 * 32);
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((nvec + threads - 1) / threads));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const auto* pp = reinterpret_cast<const int32_t*>(plan);
  const auto* rp = reinterpret_cast<const float*>(rstd);
  auto* op = reinterpret_cast<float*>(partial);
  if (al) {
    qk_dw_tiles_kernel<true><<<grid, threads, 0, s>>>(pp, tile, gp, xp, rp, op, heads, head_dim);
  } else {
    qk_dw_tiles_kernel<false><<<grid, threads, 0, s>>>(pp, tile, gp, xp, rp, op, heads, head_dim);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
