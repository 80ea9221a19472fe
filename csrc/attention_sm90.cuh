// Hopper (sm_90a) pieces both wgmma attention kernels share (attention_fwd_sm90.cu, attention_dkdv_sm90.cu):
// 128-byte-swizzled shared tiles, their wgmma descriptors, register fences, and the TMA map of a [T, H, D] store.
//
// Tile layout: ROWS rows of kMaxHeadDim (128) bf16 columns as two 64-column halves, each ROWS rows of 128 bytes;
// 16-byte chunk c of row r sits at chunk c ^ (r % 8) of its half (the 128-byte swizzle TMA writes and wgmma reads).
// Read K-major (k = column) it is an operand whose rows are the tile's rows; read MN-major (k = row) it is one whose
// columns are the tile's columns.
#pragma once

#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <cstdint>

#include "attention.cuh"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "tensor_map.cuh"

namespace gs {
namespace attn {
namespace sm90 {

constexpr int kDP = kMaxHeadDim;  // 128 columns in shared memory (columns past D zero)
constexpr int kBox = 64;          // columns per TMA box: one 128-byte swizzled row of bf16, a tile's half

// ROWS rows of kDP columns into a swizzled tile (row r from row_ptr(r), nullptr: a zero row), by THREADS threads
// through cp.async (mma::load8: columns past D zero).
template <int ROWS, int THREADS, class RowPtr>
__device__ __forceinline__ void load_sw128(unsigned char* s, RowPtr row_ptr, int64_t D, bool vec) {
  constexpr int kChunks = kDP / 8;
  for (int i = threadIdx.x; i < ROWS * kChunks; i += THREADS) {
    const int r = i / kChunks, c = i - (i / kChunks) * kChunks;
    unsigned char* dst = s + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    mma::load8(reinterpret_cast<bf16*>(dst), row_ptr(r), c * 8, D, vec);
  }
}

// A wgmma shared-memory descriptor of a 128-byte-swizzled operand at `p` (1024-byte-aligned atoms): strides in
// bytes (LBO: between 64-element MN chunks of an MN-major operand; SBO: between 8-row groups).
__device__ __forceinline__ uint64_t sw128_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint32_t a = mma::smem_addr(p);
  return static_cast<uint64_t>((a >> 4) & 0x3FFFu) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// K-major tile of ROWS rows, the descriptor of k16 step kk: 32 bytes a step inside a 64-column half. `tile` may
// point 8g rows into the tile (a warpgroup's 64 rows of a taller tile): the swizzle repeats every 8 rows.
template <int ROWS>
__device__ __forceinline__ uint64_t kmajor(const unsigned char* tile, int kk) {
  return sw128_desc(tile + (kk >> 2) * (ROWS * 128) + (kk & 3) * 32, 16, 1024);
}
// The same tile read MN-major (k = row): k16 step c starts 16 rows in; the two column halves are ROWS * 128 apart.
template <int ROWS>
__device__ __forceinline__ uint64_t mnmajor(const unsigned char* tile, int c) {
  return sw128_desc(tile + c * 16 * 128, ROWS * 128, 1024);
}

template <int N, int M>
__device__ __forceinline__ void fence_regs(float (&d)[N][M]) {
#pragma unroll
  for (int j = 0; j < N; ++j)
#pragma unroll
    for (int e = 0; e < M; ++e) cute::warpgroup_fence_operand(d[j][e]);
}

// A [T, H, D] bf16 store as a TMA map of [rows tokens, 1 head, kBox columns] boxes, 128-byte swizzle; columns past
// D read as zero. False where TMA cannot take it (16-byte rows and base needed): cp.async loads every tile then.
inline bool encode_store(CUtensorMap* map, const bf16* base, int64_t T, int64_t H, int64_t D, int rows) {
  if (D % 8 != 0 || (reinterpret_cast<uintptr_t>(base) & 15u) != 0 || T > 2147483647LL || H > 2147483647LL)
    return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(T)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(D) * 2, static_cast<cuuint64_t>(H * D) * 2};
  const cuuint32_t box[3] = {kBox, 1, static_cast<cuuint32_t>(rows)};
  const cuuint32_t unit[3] = {1, 1, 1};
  return encode_tensor_map_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(base), dims, strides,
                                 box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace sm90
}  // namespace attn
}  // namespace gs
