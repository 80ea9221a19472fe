// QK-norm dweight: the canonical per-tile sums of a per-head RMSNorm whose weight [D] is shared by all heads.
//
// Forward and dx are rms_norm's row kernels on [R * heads, D] (one row per (token, head)). dweight follows
// the canonical protocol: partial[t, :] = the sum over the tile's (token slot j, head h) pairs of
// dy[p, h, :] * (x[p, h, :] * rstd[p, h]) (-1 slots skipped), in a fixed order that depends on head_dim only
// (streams of pairs, see qk_dw_tiles_kernel); rms_norm.cu's fold_tiles then adds the partials tile after tile
// into the loaded main grad.
#include "common.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

constexpr int kBlock = 256;
constexpr int kUnroll = 4;

// One block per canonical tile (and, for head_dim > 8 * kBlock, per column range). The tile's (token slot j, head
// h) pairs, q = j * heads + h, are dealt to `streams` streams (pair q to stream q % streams, a function of head_dim
// only); a stream's threads each own one 8-column chunk and sum their pairs in q order (-1 slots skipped, as before),
// then stream 0 adds the other streams' sums in stream order. With head_dim = 128 that is 16 streams of 16 chunks:
// one warp reads two whole rows per load, where one stream per tile kept a single warp busy per tile (the kernel
// ran at ~20% of copy bandwidth).
template <bool ALIGNED>
__global__ void __launch_bounds__(kBlock) qk_dw_tiles_kernel(const int32_t* __restrict__ plan, int64_t tile,
                                                             const FoldRows<bf16> dy, const FoldRows<bf16> x,
                                                             const FoldRows<float> rstd,
                                                             float* __restrict__ partial, int64_t heads,
                                                             int64_t D, int streams) {
  __shared__ float red[kBlock * 8];
  const int chunks = kBlock / streams;  // threads of one stream
  const int stream = static_cast<int>(threadIdx.x) / chunks;
  const int lane = static_cast<int>(threadIdx.x) % chunks;
  const int64_t t = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * chunks + lane;  // columns 8v .. 8v + 7
  const bool cols = 8 * v < D;
  const int32_t* p = plan + t * tile;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
  const int64_t nq = tile * heads;
  const int64_t step = static_cast<int64_t>(streams) * kUnroll;
  for (int64_t q0 = stream; q0 < nq; q0 += step) {
    uint4 xv[kUnroll], gv[kUnroll];
    float r[kUnroll];
    bool live[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t q = q0 + static_cast<int64_t>(u) * streams;
      const int64_t j = q / heads;
      const int32_t idx = (q < nq && cols) ? __ldg(p + j) : -1;
      live[u] = idx >= 0;  // -1: a zero row, nothing is loaded
      // token row idx of the fold's row space (carried or the call's; heads rows of D each), then head q - j * heads
      const bool carried = idx < x.n_stage;
      const int64_t row = live[u] ? (carried ? idx : idx - x.n_stage) * heads + (q - j * heads) : 0;
      xv[u] = live[u] ? load_chunk<ALIGNED>(x.at(carried, row, D), v, D) : make_uint4(0u, 0u, 0u, 0u);
      gv[u] = live[u] ? load_chunk<ALIGNED>(dy.at(carried, row, D), v, D) : make_uint4(0u, 0u, 0u, 0u);
      r[u] = live[u] ? __ldg(rstd.at(carried, row, 1)) : 0.0f;
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
  if (streams > 1) {
#pragma unroll
    for (int e = 0; e < 8; ++e) red[threadIdx.x * 8 + e] = acc[e];
    __syncthreads();
    if (stream != 0) return;
    for (int k = 1; k < streams; ++k) {
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], red[(k * chunks + lane) * 8 + e]);
    }
  }
  if (!cols) return;
  float* out = partial + t * D;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (8 * v + e < D) out[8 * v + e] = acc[e];
  }
}

}  // namespace

int qk_norm_dw_tiles(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t rstd,
                     uintptr_t partial, int64_t heads, int64_t head_dim, int device, uintptr_t stream,
                     uintptr_t stage_dy, uintptr_t stage_x, uintptr_t stage_rstd, int64_t n_stage) {
  if (n_tiles == 0 || head_dim == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const FoldRows<bf16> gp = fold_rows<bf16>(stage_dy, dy, n_stage), xp = fold_rows<bf16>(stage_x, x, n_stage);
  const bool al = head_dim % 8 == 0 && aligned16(gp.call) && aligned16(gp.stage) && aligned16(xp.call) &&
                  aligned16(xp.stage);
  const int64_t nvec = (head_dim + 7) / 8;
  int chunks = 1;  // threads per stream: the power of two >= nvec, at most kBlock (a function of head_dim only)
  while (chunks < nvec && chunks < kBlock) chunks *= 2;
  const int streams = kBlock / chunks;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((nvec + chunks - 1) / chunks));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const auto* pp = reinterpret_cast<const int32_t*>(plan);
  const FoldRows<float> rp = fold_rows<float>(stage_rstd, rstd, n_stage);
  auto* op = reinterpret_cast<float*>(partial);
  if (al) {
    qk_dw_tiles_kernel<true><<<grid, kBlock, 0, s>>>(pp, tile, gp, xp, rp, op, heads, head_dim, streams);
  } else {
    qk_dw_tiles_kernel<false><<<grid, kBlock, 0, s>>>(pp, tile, gp, xp, rp, op, heads, head_dim, streams);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
