// RMSNorm forward, dx, and the canonical dweight fold.
//
// Forward and dx: one block per row; the block size depends on the hidden size only, and thread t owns
// chunks t, t + blockDim, ... (8 elements each) whether they are read by 16-byte or scalar loads, so a
// row's reduction order is a function of H alone, never of the number of rows or the alignment.
// H <= 256 (at most 32 chunks: the block is one warp, lane t owns chunk t; QK-norm's heads): one warp per row
// instead, several rows per warp and eight warps per block (a 32-thread block per row kept ~1 KB in flight per
// SM: QK-norm ran at ~20% of copy bandwidth). The lane -> chunk map and the reduction are the block kernel's:
// block_sum on one warp is the warp's xor butterfly, then the second butterfly adds the absent warps' zeros,
// i.e. + 0.0f. So a row's bits are the same on either path (GPU test: tests/test_cuda_ops.py).
// dweight (canonical protocol): kernel 1 sums each canonical tile of the plan, rows in slot order, one
// thread per 8 columns (tiles in parallel: their sums are independent); kernel 2 loads main_grad and
// adds the tile sums one after another in plan order, then stores it back.
#include "common.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

constexpr int kNpt = 4;          // chunks of 8 per thread held in registers (H <= 4 * 8 * 1024)
constexpr int kTileThreads = 128;
constexpr int kTileUnroll = 4;   // plan rows whose loads are in flight together
constexpr int kFoldThreads = 128;
constexpr int kFoldUnroll = 64;  // tile sums loaded ahead of their (sequential) adds (16 left the fold latency-bound)
constexpr int kWarpRowsWarps = 8;   // warps per block of the one-warp-per-row kernels (H <= 256)
constexpr int kWarpRowsUnroll = 4;  // rows a warp loads before it reduces them
constexpr int64_t kWarpRowsMaxChunks = 32;

// The per-row arithmetic of both row paths (a block per row, a warp per row), written once: the two paths give the
// same bits by construction, the reduction aside (block_sum against one_warp_block_sum, argued below).
__device__ __forceinline__ float add_squares(const float f[8], float ss) {
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = __fmaf_rn(f[e], f[e], ss);
  return ss;
}

__device__ __forceinline__ float row_rstd(float ss, int64_t hidden, float eps) {
  return __frsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(hidden)), eps));
}

// y = (x * r) * w, in place on one chunk.
__device__ __forceinline__ void normalize_chunk(float f[8], float r, const float g[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = __fmul_rn(__fmul_rn(f[e], r), g[e]);
}

// c + sum over the chunk of (dy * w) * x.
__device__ __forceinline__ float add_dyw_x(const float g[8], const float ww[8], const float f[8], float c) {
#pragma unroll
  for (int e = 0; e < 8; ++e) c = __fmaf_rn(__fmul_rn(g[e], ww[e]), f[e], c);
  return c;
}

// r^2 * sum(dy * w * x) / H.
__device__ __forceinline__ float dx_coeff(float c, int64_t hidden, float r) {
  return __fmul_rn(__fmul_rn(__fdiv_rn(c, static_cast<float>(hidden)), r), r);
}

// dx = r * (dy * w - x * kf), in place of x on one chunk.
__device__ __forceinline__ void dx_chunk(float f[8], const float g[8], const float ww[8], float r, float kf) {
#pragma unroll
  for (int e = 0; e < 8; ++e) f[e] = __fmul_rn(r, __fmaf_rn(-f[e], kf, __fmul_rn(g[e], ww[e])));
}

int row_threads(int64_t hidden) {
  const int64_t nvec = (hidden + 7) / 8;
  int64_t t = (nvec + kNpt - 1) / kNpt;
  t = (t + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : t);
}

template <bool ALIGNED>
__global__ void __launch_bounds__(1024) rms_fwd_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                                        bf16* __restrict__ y, float* __restrict__ rstd_out,
                                                        int64_t hidden, float eps) {
  __shared__ float red[33];
  const int64_t row = blockIdx.x;
  const bf16* xr = x + row * hidden;
  const int64_t nvec = (hidden + 7) / 8;
  uint4 xv[kNpt];
#pragma unroll
  for (int k = 0; k < kNpt; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    xv[k] = v < nvec ? load_chunk<ALIGNED>(xr, v, hidden) : make_uint4(0u, 0u, 0u, 0u);
  }
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNpt; ++k) {
    float f[8];
    unpack8(xv[k], f);
    ss = add_squares(f, ss);
  }
  ss = block_sum(ss, red);
  const float r = row_rstd(ss, hidden, eps);
  if (rstd_out != nullptr && threadIdx.x == 0) rstd_out[row] = r;
  bf16* yr = y + row * hidden;
#pragma unroll
  for (int k = 0; k < kNpt; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < nvec) {
      float f[8], g[8];
      unpack8(xv[k], f);
      unpack8(load_chunk<ALIGNED>(w, v, hidden), g);
      normalize_chunk(f, r, g);
      store_chunk<ALIGNED>(yr, v, hidden, pack8(f));
    }
  }
}

// dx = r * (dy*w - x * (r^2 * sum(dy*w*x) / H)), the exact VJP of y = x * r * w with r = rsqrt(mean(x^2)+eps).
template <bool ALIGNED>
__global__ void __launch_bounds__(1024) rms_bwd_dx_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                                           const bf16* __restrict__ w,
                                                           const float* __restrict__ rstd,
                                                           bf16* __restrict__ dx, int64_t hidden) {
  __shared__ float red[33];
  const int64_t row = blockIdx.x;
  const int64_t nvec = (hidden + 7) / 8;
  const bf16* xr = x + row * hidden;
  const bf16* dyr = dy + row * hidden;
  uint4 xv[kNpt], gv[kNpt];
#pragma unroll
  for (int k = 0; k < kNpt; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    const bool ok = v < nvec;
    xv[k] = ok ? load_chunk<ALIGNED>(xr, v, hidden) : make_uint4(0u, 0u, 0u, 0u);
    gv[k] = ok ? load_chunk<ALIGNED>(dyr, v, hidden) : make_uint4(0u, 0u, 0u, 0u);
  }
  const float r = __ldg(rstd + row);
  float c = 0.0f;
#pragma unroll
  for (int k = 0; k < kNpt; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < nvec) {
      float f[8], g[8], ww[8];
      unpack8(xv[k], f);
      unpack8(gv[k], g);
      unpack8(load_chunk<ALIGNED>(w, v, hidden), ww);
      c = add_dyw_x(g, ww, f, c);
    }
  }
  c = block_sum(c, red);
  const float kf = dx_coeff(c, hidden, r);
  bf16* dxr = dx + row * hidden;
#pragma unroll
  for (int k = 0; k < kNpt; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * blockDim.x;
    if (v < nvec) {
      float f[8], g[8], ww[8];
      unpack8(xv[k], f);
      unpack8(gv[k], g);
      unpack8(load_chunk<ALIGNED>(w, v, hidden), ww);
      dx_chunk(f, g, ww, r, kf);
      store_chunk<ALIGNED>(dxr, v, hidden, pack8(f));
    }
  }
}

// block_sum on a one-warp block: the warp's butterfly, then + 0.0f (the second butterfly's absent warps).
__device__ __forceinline__ float one_warp_block_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return __fadd_rn(v, 0.0f);
}

// rms_fwd_kernel for H <= 256 (one chunk per lane, lanes >= nvec hold zeros), one warp per row, kWarpRowsUnroll
// consecutive rows per warp loaded before the first is reduced.
template <bool ALIGNED>
__global__ void __launch_bounds__(kWarpRowsWarps * 32) rms_fwd_warp_rows_kernel(
    const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y, float* __restrict__ rstd_out,
    int64_t rows, int64_t hidden, float eps) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpRowsWarps + (threadIdx.x >> 5)) * kWarpRowsUnroll;
  const bool mine = lane < (hidden + 7) / 8;
  uint4 xv[kWarpRowsUnroll];
#pragma unroll
  for (int u = 0; u < kWarpRowsUnroll; ++u) {
    const int64_t row = row0 + u;
    xv[u] = mine && row < rows ? load_chunk<ALIGNED>(x + row * hidden, lane, hidden) : make_uint4(0u, 0u, 0u, 0u);
  }
  float g[8];
  unpack8(mine ? load_chunk<ALIGNED>(w, lane, hidden) : make_uint4(0u, 0u, 0u, 0u), g);
#pragma unroll
  for (int u = 0; u < kWarpRowsUnroll; ++u) {
    const int64_t row = row0 + u;
    if (row >= rows) break;  // warp-uniform
    float f[8];
    unpack8(xv[u], f);
    const float ss = one_warp_block_sum(add_squares(f, 0.0f));
    const float r = row_rstd(ss, hidden, eps);
    if (rstd_out != nullptr && lane == 0) rstd_out[row] = r;
    if (mine) {
      normalize_chunk(f, r, g);
      store_chunk<ALIGNED>(y + row * hidden, lane, hidden, pack8(f));
    }
  }
}

// rms_bwd_dx_kernel for H <= 256, one warp per row (as rms_fwd_warp_rows_kernel).
template <bool ALIGNED>
__global__ void __launch_bounds__(kWarpRowsWarps * 32) rms_bwd_dx_warp_rows_kernel(
    const bf16* __restrict__ dy, const bf16* __restrict__ x, const bf16* __restrict__ w,
    const float* __restrict__ rstd, bf16* __restrict__ dx, int64_t rows, int64_t hidden) {
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarpRowsWarps + (threadIdx.x >> 5)) * kWarpRowsUnroll;
  const bool mine = lane < (hidden + 7) / 8;
  uint4 xv[kWarpRowsUnroll], gv[kWarpRowsUnroll];
  float r[kWarpRowsUnroll];
#pragma unroll
  for (int u = 0; u < kWarpRowsUnroll; ++u) {
    const int64_t row = row0 + u;
    const bool ok = mine && row < rows;
    xv[u] = ok ? load_chunk<ALIGNED>(x + row * hidden, lane, hidden) : make_uint4(0u, 0u, 0u, 0u);
    gv[u] = ok ? load_chunk<ALIGNED>(dy + row * hidden, lane, hidden) : make_uint4(0u, 0u, 0u, 0u);
    r[u] = row < rows ? __ldg(rstd + row) : 0.0f;
  }
  float ww[8];
  unpack8(mine ? load_chunk<ALIGNED>(w, lane, hidden) : make_uint4(0u, 0u, 0u, 0u), ww);
#pragma unroll
  for (int u = 0; u < kWarpRowsUnroll; ++u) {
    const int64_t row = row0 + u;
    if (row >= rows) break;  // warp-uniform
    float f[8], g[8];
    unpack8(xv[u], f);
    unpack8(gv[u], g);
    const float c = one_warp_block_sum(mine ? add_dyw_x(g, ww, f, 0.0f) : 0.0f);
    const float kf = dx_coeff(c, hidden, r[u]);
    if (mine) {
      dx_chunk(f, g, ww, r[u], kf);
      store_chunk<ALIGNED>(dx + row * hidden, lane, hidden, pack8(f));
    }
  }
}

// Whether a call of H columns takes the one-warp-per-row kernels: warp_rows < 0 (auto) when H fits one warp's
// chunks; 0 / 1 force a path (the GPU test compares their bits).
bool use_warp_rows(int64_t hidden, int warp_rows) {
  const bool fits = (hidden + 7) / 8 <= kWarpRowsMaxChunks;
  return warp_rows < 0 ? fits : (warp_rows != 0 && fits);
}

// Grid and block of a row kernel: a block per row (threads by H), or warps of kWarpRowsUnroll rows.
struct RowLaunch {
  bool warp_rows;
  dim3 grid;
  int threads;
};

RowLaunch row_launch(int64_t rows, int64_t hidden, int warp_rows) {
  if (use_warp_rows(hidden, warp_rows)) {
    constexpr int64_t per_block = static_cast<int64_t>(kWarpRowsWarps) * kWarpRowsUnroll;
    return {true, dim3(static_cast<unsigned>((rows + per_block - 1) / per_block)), kWarpRowsWarps * 32};
  }
  return {false, dim3(static_cast<unsigned>(rows)), row_threads(hidden)};
}

// partial[t, :] = sum over j = 0 .. tile-1 (in that order) of dy[plan[t, j]] * (x[plan[t, j]] * rstd[plan[t, j]]),
// rows with plan index -1 skipped (zero rows); rows of the fold's row space (FoldRows: carried rows read in place;
// CARRIED false: none, the call's rows alone, as before the row space had two bases: 56 registers against 64).
// blockIdx.x = tile, blockIdx.y * blockDim.x + threadIdx.x = chunk.
template <bool ALIGNED, bool CARRIED>
__global__ void __launch_bounds__(kTileThreads) rms_dw_tiles_kernel(const int32_t* __restrict__ plan, int64_t tile,
                                                                    const FoldRows<bf16> dy, const FoldRows<bf16> x,
                                                                    const FoldRows<float> rstd,
                                                                    float* __restrict__ partial, int64_t hidden) {
  const int64_t t = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t nvec = (hidden + 7) / 8;
  if (v >= nvec) return;
  const int32_t* p = plan + t * tile;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
  for (int64_t j0 = 0; j0 < tile; j0 += kTileUnroll) {
    int32_t idx[kTileUnroll];
    uint4 xv[kTileUnroll], gv[kTileUnroll];
    float r[kTileUnroll];
#pragma unroll
    for (int u = 0; u < kTileUnroll; ++u) idx[u] = j0 + u < tile ? __ldg(p + j0 + u) : -1;
#pragma unroll
    for (int u = 0; u < kTileUnroll; ++u) {
      const int64_t src = idx[u] < 0 ? 0 : idx[u];  // a zero row loads row 0 and discards it
      if (idx[u] >= 0) {  // (its base and index there, once for the three tensors of the row space)
        const bool carried = CARRIED && src < x.n_stage;
        const int64_t local = carried || !CARRIED ? src : src - x.n_stage;
        xv[u] = load_chunk<ALIGNED>(x.at(carried, local, hidden), v, hidden);
        gv[u] = load_chunk<ALIGNED>(dy.at(carried, local, hidden), v, hidden);
        r[u] = __ldg(rstd.at(carried, local, 1));
      } else {
        xv[u] = make_uint4(0u, 0u, 0u, 0u);
        gv[u] = xv[u];
        r[u] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kTileUnroll; ++u) {
      if (idx[u] >= 0) {
        float f[8], g[8];
        unpack8(xv[u], f);
        unpack8(gv[u], g);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] = __fmaf_rn(g[e], __fmul_rn(f[e], r[u]), acc[e]);
      }
    }
  }
  float* out = partial + t * hidden;
  if constexpr (ALIGNED) {
    reinterpret_cast<float4*>(out)[2 * v] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    reinterpret_cast<float4*>(out)[2 * v + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (8 * v + e < hidden) out[8 * v + e] = acc[e];
    }
  }
}

// main_grad[c] = (((main_grad[c] + partial[0, c]) + partial[1, c]) + ...), tiles in plan order.
__global__ void __launch_bounds__(kFoldThreads) fold_tiles_kernel(const float* __restrict__ partial, int64_t n_tiles,
                                                                  float* __restrict__ main_grad, int64_t cols) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = main_grad[c];
  for (int64_t t0 = 0; t0 < n_tiles; t0 += kFoldUnroll) {
    float part[kFoldUnroll];
#pragma unroll
    for (int u = 0; u < kFoldUnroll; ++u) part[u] = t0 + u < n_tiles ? __ldg(partial + (t0 + u) * cols + c) : 0.0f;
#pragma unroll
    for (int u = 0; u < kFoldUnroll; ++u) {
      if (t0 + u < n_tiles) acc = __fadd_rn(acc, part[u]);
    }
  }
  main_grad[c] = acc;
}

}  // namespace

int rms_norm_fwd(uintptr_t x, uintptr_t w, uintptr_t y, uintptr_t rstd, int64_t rows, int64_t hidden, float eps,
                 int device, uintptr_t stream, int warp_rows) {
  if (rows == 0 || hidden == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* xp = reinterpret_cast<const bf16*>(x);
  const auto* wp = reinterpret_cast<const bf16*>(w);
  auto* yp = reinterpret_cast<bf16*>(y);
  auto* rp = reinterpret_cast<float*>(rstd);
  const bool al = hidden % 8 == 0 && aligned16(xp) && aligned16(wp) && aligned16(yp);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const RowLaunch rl = row_launch(rows, hidden, warp_rows);
  return launch_aligned(al, [&](auto aligned) {
    constexpr bool A = decltype(aligned)::value;
    if (rl.warp_rows) {
      rms_fwd_warp_rows_kernel<A><<<rl.grid, rl.threads, 0, s>>>(xp, wp, yp, rp, rows, hidden, eps);
    } else {
      rms_fwd_kernel<A><<<rl.grid, rl.threads, 0, s>>>(xp, wp, yp, rp, hidden, eps);
    }
  });
}

int rms_norm_bwd_dx(uintptr_t dy, uintptr_t x, uintptr_t w, uintptr_t rstd, uintptr_t dx, int64_t rows,
                    int64_t hidden, int device, uintptr_t stream, int warp_rows) {
  if (rows == 0 || hidden == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* gp = reinterpret_cast<const bf16*>(dy);
  const auto* xp = reinterpret_cast<const bf16*>(x);
  const auto* wp = reinterpret_cast<const bf16*>(w);
  const auto* rp = reinterpret_cast<const float*>(rstd);
  auto* dp = reinterpret_cast<bf16*>(dx);
  const bool al = hidden % 8 == 0 && aligned16(gp) && aligned16(xp) && aligned16(wp) && aligned16(dp);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const RowLaunch rl = row_launch(rows, hidden, warp_rows);
  return launch_aligned(al, [&](auto aligned) {
    constexpr bool A = decltype(aligned)::value;
    if (rl.warp_rows) {
      rms_bwd_dx_warp_rows_kernel<A><<<rl.grid, rl.threads, 0, s>>>(gp, xp, wp, rp, dp, rows, hidden);
    } else {
      rms_bwd_dx_kernel<A><<<rl.grid, rl.threads, 0, s>>>(gp, xp, wp, rp, dp, hidden);
    }
  });
}

int rms_norm_dw_tiles(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t rstd,
                      uintptr_t partial, int64_t hidden, int device, uintptr_t stream, uintptr_t stage_dy,
                      uintptr_t stage_x, uintptr_t stage_rstd, int64_t n_stage) {
  if (n_tiles == 0 || hidden == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* pp = reinterpret_cast<const int32_t*>(plan);
  const FoldRows<bf16> gp = fold_rows<bf16>(stage_dy, dy, n_stage), xp = fold_rows<bf16>(stage_x, x, n_stage);
  const FoldRows<float> rp = fold_rows<float>(stage_rstd, rstd, n_stage);
  auto* op = reinterpret_cast<float*>(partial);
  const bool al = hidden % 8 == 0 && aligned16(gp.call) && aligned16(gp.stage) && aligned16(xp.call) &&
                  aligned16(xp.stage) && aligned16(op);
  const int64_t nvec = (hidden + 7) / 8;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>((nvec + kTileThreads - 1) / kTileThreads));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return launch_aligned(al, [&](auto aligned) {
    constexpr bool A = decltype(aligned)::value;
    if (n_stage > 0) {
      rms_dw_tiles_kernel<A, true><<<grid, kTileThreads, 0, s>>>(pp, tile, gp, xp, rp, op, hidden);
    } else {
      rms_dw_tiles_kernel<A, false><<<grid, kTileThreads, 0, s>>>(pp, tile, gp, xp, rp, op, hidden);
    }
  });
}

int fold_tiles(uintptr_t partial, int64_t n_tiles, uintptr_t main_grad, int64_t cols, int device,
               uintptr_t stream) {
  if (n_tiles == 0 || cols == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const dim3 grid(static_cast<unsigned>((cols + kFoldThreads - 1) / kFoldThreads));
  fold_tiles_kernel<<<grid, kFoldThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const float*>(partial), n_tiles, reinterpret_cast<float*>(main_grad), cols);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
