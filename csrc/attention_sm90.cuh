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
#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90_desc.hpp"
#include "cute/arch/mma_sm90_gmma.hpp"
#include "cutlass/arch/barrier.h"
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

// The first 1024-byte boundary at or after p: where swizzled tiles (wgmma atoms, TMA boxes) may start.
__device__ __forceinline__ unsigned char* align1024(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t{1023});
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

// ROWS rows of one head of a [T, H, D] store from token tok by TMA, as two 64-column boxes that land swizzled exactly
// as load_sw128 places the bytes. Called by one thread, after it announced the bytes on `full`.
template <int ROWS>
__device__ __forceinline__ void tma_rows(const CUtensorMap* map, uint64_t* full, unsigned char* tile, int64_t head,
                                         int64_t tok) {
#pragma unroll
  for (int h = 0; h < kDP / kBox; ++h)
    cute::SM90_TMA_LOAD_3D::copy(map, full, static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                 tile + h * ROWS * 128, h * kBox, static_cast<int32_t>(head),
                                 static_cast<int32_t>(tok));
}

// The K / V stores of a row program's kv head as TMA maps of BN-token boxes: both or neither (cp.async then).
inline bool encode_kv(CUtensorMap* map_k, CUtensorMap* map_v, const bf16* k, const bf16* v, int64_t T, int64_t HKV,
                      int64_t D, int rows) {
  return encode_store(map_k, k, T, HKV, D, rows) && encode_store(map_v, v, T, HKV, D, rows);
}

// The key / value blocks of a row program (the wgmma forward and dQ) through STAGES shared-memory stages of one K
// and one V block of BN keys each. A whole block of written keys comes by TMA (one thread issues two boxes a
// tensor that complete on the stage's barrier: 256 threads issuing cp.async of 32 KB a block bound the first
// wgmma forward); the block holding the program's last row by cp.async with zero rows past it (keys past the
// program's last row may be unwritten cache slots: never read). Either way the same bytes at the same addresses.
// Use: init() by thread 0 before the CTA's first barrier; load(stage, b) issues block b (no commit); wait(b) makes
// block b readable by wgmma (this thread's cp.async landed and fenced for the async proxy, the stage's TMA bytes
// arrived), to be followed by a CTA barrier.
template <int BN, int STAGES, int THREADS>
struct KeyBlocks {
  using FullBarrier = cutlass::arch::ClusterTransactionBarrier;
  static constexpr int kBytes = BN * kDP * 2;
  static constexpr int kSmem = 2 * STAGES * kBytes + STAGES * 8;  // the K stages, the V stages, the barriers

  unsigned char* sK;  // [STAGES] blocks, then the V blocks and the barriers
  const CUtensorMap* map_k;
  const CUtensorMap* map_v;
  bool tma;
  const bf16* k;
  const bf16* v;
  int64_t kv_tok, hk, HKV, D;
  int pmax;
  bool vec;

  __device__ __forceinline__ unsigned char* k_stage(int stage) const { return sK + stage * kBytes; }
  __device__ __forceinline__ unsigned char* v_stage(int stage) const { return sK + (STAGES + stage) * kBytes; }
  __device__ __forceinline__ uint64_t* full(int stage) const {
    return reinterpret_cast<uint64_t*>(sK + 2 * STAGES * kBytes) + stage;
  }

  __device__ __forceinline__ void init() const {
    for (int st = 0; st < STAGES; ++st) FullBarrier::init(full(st), 1);
    cutlass::arch::fence_barrier_init();
    if (tma) {
      cute::prefetch_tma_descriptor(map_k);
      cute::prefetch_tma_descriptor(map_v);
    }
  }

  __device__ __forceinline__ void load(int stage, int b) const {
    const int n0 = b * BN;
    if (tma && n0 + BN - 1 <= pmax) {  // a whole block of written keys
      if (threadIdx.x == 0) {
        FullBarrier::arrive_and_expect_tx(full(stage), 2 * kBytes);
        tma_rows<BN>(map_k, full(stage), k_stage(stage), hk, kv_tok + n0);
        tma_rows<BN>(map_v, full(stage), v_stage(stage), hk, kv_tok + n0);
      }
      return;
    }
    load_sw128<BN, THREADS>(k_stage(stage), [&](int r) { return key_row(k, n0 + r, pmax, kv_tok, HKV, hk, D); }, D,
                            vec);
    load_sw128<BN, THREADS>(v_stage(stage), [&](int r) { return key_row(v, n0 + r, pmax, kv_tok, HKV, hk, D); }, D,
                            vec);
    if (threadIdx.x == 0) FullBarrier::arrive(full(stage));  // the phase completes; cp.async is waited in wait()
  }

  __device__ __forceinline__ void wait(int b) const {
    mma::cp_async_wait<STAGES - 2>();
    cutlass::arch::fence_view_async_shared();  // this thread's cp.async writes, visible to wgmma's async proxy
    FullBarrier::wait(full(b % STAGES), static_cast<uint32_t>((b / STAGES) & 1));  // its TMA bytes, if any
  }

};

}  // namespace sm90
}  // namespace attn
}  // namespace gs
