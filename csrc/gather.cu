// Row movement kernels: embedding gather and its canonical weight-gradient fold, pack / unpack.
//
// embedding_fwd: y[r] = weight[ids[r]] (bit copies; an id outside [0, V) gives a zero row instead of a read
// out of bounds). embedding_fold: the caller lists the fold step's tokens in canonical order, sorted stably by
// id (so each id's tokens stay in canonical order); block (i, column block) starts work only if i is the
// first token of its id's run: it LOADS main_grad[id], adds the run's dy rows one after another in fp32,
// and stores the row back. No two blocks touch the same row (one run per id), so there are no atomics, and
// every vocabulary row sees the same chain of adds in every layout. Pads never reach the fold (the plan
// excludes them).
// pack / unpack: row copies between a sample's padded slot [b * L + p] and its packed slot [first_b + p].
#include <algorithm>

#include "common.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

constexpr int kRowThreads = 128;  // 8 columns per thread: 1024 columns per block

template <bool ALIGNED>
__global__ void __launch_bounds__(kRowThreads) embedding_fwd_kernel(const int64_t* __restrict__ ids,
                                                                    const bf16* __restrict__ w, bf16* __restrict__ y,
                                                                    int64_t V, int64_t H) {
  const int64_t r = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * kRowThreads + threadIdx.x;
  if (8 * v >= H) return;
  const int64_t id = ids[r];
  const uint4 u = (id >= 0 && id < V) ? load_chunk<ALIGNED>(w + id * H, v, H) : make_uint4(0u, 0u, 0u, 0u);
  store_chunk<ALIGNED>(y + r * H, v, H, u);
}

__global__ void __launch_bounds__(kRowThreads) embedding_fold_kernel(const int64_t* __restrict__ sorted_ids,
                                                                     const int32_t* __restrict__ src, int64_t n,
                                                                     const bf16* __restrict__ dy,
                                                                     float* __restrict__ main_grad, int64_t V,
                                                                     int64_t H) {
  const int64_t i = blockIdx.x;
  const int64_t id = sorted_ids[i];
  if (i > 0 && sorted_ids[i - 1] == id) return;  // not the first token of its id's run
  if (id < 0 || id >= V) return;
  const int64_t c0 = 8 * (static_cast<int64_t>(blockIdx.y) * kRowThreads + threadIdx.x);
  if (c0 >= H) return;
  float* out = main_grad + id * H;
  float acc[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = c0 + e < H ? out[c0 + e] : 0.0f;  // the main grad, loaded first
  constexpr int kUnroll = 4;  // dy rows of the run loaded ahead of their in-order adds
  for (int64_t j0 = i; j0 < n && sorted_ids[j0] == id; j0 += kUnroll) {
    float rowv[kUnroll][8];
    bool live[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = j0 + u;
      live[u] = j < n && sorted_ids[j] == id;
      const bf16* row = dy + static_cast<int64_t>(live[u] ? src[j] : 0) * H;
#pragma unroll
      for (int e = 0; e < 8; ++e) rowv[u][e] = (live[u] && c0 + e < H) ? __bfloat162float(row[c0 + e]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!live[u]) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] = __fadd_rn(acc[e], rowv[u][e]);
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (c0 + e < H) out[c0 + e] = acc[e];
  }
}

// The canonical fold's staging copy by pieces (CanonicalFold.take(..., stage_copy=)): piece p = (source row,
// staging row, length), int32. Rows are row_words words of W bytes; source rows are src_stride words apart (a
// strided call tensor), staging rows contiguous. Block (p, y) copies rows y, y + gridDim.y, ... of piece p, its
// threads striding over a row's words: each byte is read once and written once (index_select + index_copy_ move
// it twice, through a temporary), and the host uploads O(pieces) instead of an O(rows) index.
template <typename W>
__global__ void __launch_bounds__(kRowThreads) copy_pieces_kernel(const int32_t* __restrict__ pieces,
                                                                  const W* __restrict__ src, W* __restrict__ dst,
                                                                  int64_t src_stride, int64_t row_words) {
  const int64_t s0 = pieces[3 * blockIdx.x], d0 = pieces[3 * blockIdx.x + 1], n = pieces[3 * blockIdx.x + 2];
  for (int64_t r = blockIdx.y; r < n; r += gridDim.y) {
    const W* from = src + (s0 + r) * src_stride;
    W* to = dst + (d0 + r) * row_words;
    for (int64_t c = threadIdx.x; c < row_words; c += kRowThreads) to[c] = from[c];
  }
}

// Grid (padded row b * L + p, column blocks). meta = [lengths (B), first packed row (B), first real slot (B)]
// (int64): sample b's real rows are slots [start_b, start_b + length_b) of its padded row block (0 when right
// padded, L - length_b when left padded).
template <bool ALIGNED, bool UNPACK>
__global__ void __launch_bounds__(kRowThreads) pack_kernel(const bf16* __restrict__ src, bf16* __restrict__ dst,
                                                           const int64_t* __restrict__ meta, int64_t n_samples,
                                                           int64_t max_len, int64_t H) {
  const int64_t slot = blockIdx.x;
  const int64_t b = slot / max_len;
  const int64_t p = slot - b * max_len;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * kRowThreads + threadIdx.x;
  if (8 * v >= H) return;
  const int64_t q = p - meta[2 * n_samples + b];  // position inside the sample
  const bool real = q >= 0 && q < meta[b];
  const int64_t packed = meta[n_samples + b] + q;
  if constexpr (UNPACK) {
    const uint4 u = real ? load_chunk<ALIGNED>(src + packed * H, v, H) : make_uint4(0u, 0u, 0u, 0u);
    store_chunk<ALIGNED>(dst + slot * H, v, H, u);
  } else {
    if (real) store_chunk<ALIGNED>(dst + packed * H, v, H, load_chunk<ALIGNED>(src + slot * H, v, H));
  }
}

unsigned col_blocks(int64_t H) { return static_cast<unsigned>(((H + 7) / 8 + kRowThreads - 1) / kRowThreads); }

}  // namespace

int embedding_fwd(uintptr_t ids, uintptr_t weight, uintptr_t y, int64_t rows, int64_t V, int64_t H, int device,
                  uintptr_t stream) {
  if (rows == 0 || H == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* wp = reinterpret_cast<const bf16*>(weight);
  auto* yp = reinterpret_cast<bf16*>(y);
  const auto* ip = reinterpret_cast<const int64_t*>(ids);
  const dim3 grid(static_cast<unsigned>(rows), col_blocks(H));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (H % 8 == 0 && aligned16(wp) && aligned16(yp)) {
    embedding_fwd_kernel<true><<<grid, kRowThreads, 0, s>>>(ip, wp, yp, V, H);
  } else {
    embedding_fwd_kernel<false><<<grid, kRowThreads, 0, s>>>(ip, wp, yp, V, H);
  }
  return static_cast<int>(cudaGetLastError());
}

int embedding_fold(uintptr_t sorted_ids, uintptr_t src, int64_t n, uintptr_t dy, uintptr_t main_grad, int64_t V,
                   int64_t H, int device, uintptr_t stream) {
  if (n == 0 || H == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const dim3 grid(static_cast<unsigned>(n), col_blocks(H));
  embedding_fold_kernel<<<grid, kRowThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const int64_t*>(sorted_ids), reinterpret_cast<const int32_t*>(src), n,
      reinterpret_cast<const bf16*>(dy), reinterpret_cast<float*>(main_grad), V, H);
  return static_cast<int>(cudaGetLastError());
}

int pack_rows(uintptr_t src, uintptr_t dst, uintptr_t meta, int64_t n_samples, int64_t max_len, int64_t H,
              bool unpack, int device, uintptr_t stream) {
  if (n_samples == 0 || max_len == 0 || H == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* sp = reinterpret_cast<const bf16*>(src);
  auto* dp = reinterpret_cast<bf16*>(dst);
  const auto* mp = reinterpret_cast<const int64_t*>(meta);
  const dim3 grid(static_cast<unsigned>(n_samples * max_len), col_blocks(H));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const bool al = H % 8 == 0 && aligned16(sp) && aligned16(dp);
  if (unpack) {
    if (al) {
      pack_kernel<true, true><<<grid, kRowThreads, 0, s>>>(sp, dp, mp, n_samples, max_len, H);
    } else {
      pack_kernel<false, true><<<grid, kRowThreads, 0, s>>>(sp, dp, mp, n_samples, max_len, H);
    }
  } else if (al) {
    pack_kernel<true, false><<<grid, kRowThreads, 0, s>>>(sp, dp, mp, n_samples, max_len, H);
  } else {
    pack_kernel<false, false><<<grid, kRowThreads, 0, s>>>(sp, dp, mp, n_samples, max_len, H);
  }
  return static_cast<int>(cudaGetLastError());
}

int copy_pieces(uintptr_t pieces, uintptr_t src, uintptr_t dst, int64_t n_pieces, int64_t longest,
                int64_t src_stride_bytes, int64_t row_bytes, int device, uintptr_t stream) {
  if (n_pieces == 0 || longest <= 0 || row_bytes == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  // rows by up to 16-byte words: the widest word that divides the row, the source stride and both addresses
  const uintptr_t any = src | dst | static_cast<uintptr_t>(row_bytes) | static_cast<uintptr_t>(src_stride_bytes);
  const int64_t word = (any & 15u) == 0 ? 16 : (any & 7u) == 0 ? 8 : (any & 3u) == 0 ? 4 : 1;
  const int64_t row_words = row_bytes / word, stride = src_stride_bytes / word;
  // enough row blocks per piece to fill the device with ~25 pieces, each block looping over the rest of its rows
  const unsigned y = static_cast<unsigned>(std::min<int64_t>(longest, std::max<int64_t>(1, 65535 / 8)));
  const dim3 grid(static_cast<unsigned>(n_pieces), y);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const auto* pp = reinterpret_cast<const int32_t*>(pieces);
  switch (word) {
    case 16:
      copy_pieces_kernel<uint4><<<grid, kRowThreads, 0, s>>>(pp, reinterpret_cast<const uint4*>(src),
                                                             reinterpret_cast<uint4*>(dst), stride, row_words);
      break;
    case 8:
      copy_pieces_kernel<uint2><<<grid, kRowThreads, 0, s>>>(pp, reinterpret_cast<const uint2*>(src),
                                                             reinterpret_cast<uint2*>(dst), stride, row_words);
      break;
    case 4:
      copy_pieces_kernel<uint32_t><<<grid, kRowThreads, 0, s>>>(pp, reinterpret_cast<const uint32_t*>(src),
                                                                reinterpret_cast<uint32_t*>(dst), stride, row_words);
      break;
    default:
      copy_pieces_kernel<uint8_t><<<grid, kRowThreads, 0, s>>>(pp, reinterpret_cast<const uint8_t*>(src),
                                                               reinterpret_cast<uint8_t*>(dst), stride, row_words);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
