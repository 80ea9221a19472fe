// Tensor-core GEMM mainloop of the gradsweep CUDA family (mma.sync m16n8k16 bf16 -> fp32, cp.async pipeline).
//
// Why it is batch-invariant: every output element is one fp32 accumulator register that receives, in
// ascending k, one mma per 16-wide k step (k = 0..15, 16..31, ...). Tile shapes (BM, BN, BK, warps, stages)
// only decide WHICH thread owns an element and how many k steps sit in one shared-memory stage; the chain
// of mma k steps an element sees is the same for every configuration, every M and every row position
// (there is no split of K anywhere). The element-wise epilogues are row-local. So a row's bits follow its
// own data, never M, its position in the batch, or the tile configuration picked for that M.
//
// Operands (element (m, k) of A, (n, k) of B; the GEMM computes C[m, n] = sum_k A(m, k) B(n, k)):
//   A_KMAJ: A(m, k) = a[m * lda + k]          else A(m, k) = a[src(k) * lda + m]   (M-major)
//   B_KMAJ: B(n, k) = b[n * ldb + k]          else B(n, k) = b[src(k) * ldb + n]   (N-major)
// src(k) = kmap[k] when a kmap is given (the canonical fold's plan: token rows gathered, -1 = zero row),
// else k. Out-of-range rows / columns / k and -1 rows are ZERO-FILLED in shared memory (never loaded and
// multiplied by zero: 0 * NaN = NaN, and a pad row may hold NaN).
//
// Shared memory: each operand tile is stored as it lies in memory (K-major [rows][BK], M/N-major [BK][cols]),
// rows padded by 8 bf16 (16 bytes) so that ldmatrix reads are bank-conflict free; M/N-major tiles are read
// with ldmatrix.trans. A 16-byte chunk is copied by cp.async when the row is 16-byte aligned and the chunk
// whole, else element by element (same bits in shared memory, so the same mma inputs).
#pragma once

#include <cstdint>

#include "common.cuh"

namespace gs {
namespace mma {

struct GemmArgs {
  const bf16* a;
  int64_t lda;
  const bf16* b;
  int64_t ldb;
  int64_t M, N, K;
  const int32_t* kmap;  // nullptr: identity; else K entries (row of the M/N-major operands, -1 = zero row)
  bool vec_a, vec_b;    // 16-byte cp.async allowed (base 16-byte aligned and ld % 8 == 0; the stage bases too)
  // With a kmap, its rows [0, n_stage) are rows of a_stage / b_stage (a fold's carried rows, read in place: common.cuh
  // FoldRows) and row r >= n_stage is row r - n_stage of a / b. n_stage 0: a / b alone.
  const bf16* a_stage = nullptr;
  int64_t lda_stage = 0;
  const bf16* b_stage = nullptr;
  int64_t ldb_stage = 0;
  int64_t n_stage = 0;
};

// BM x BN output tile, BK k per stage, warps of WM x WN, STAGES-deep cp.async pipeline.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int STAGES_>
struct Cfg {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_, STAGES = STAGES_;
  static constexpr int WARPS_M = BM / WM, WARPS_N = BN / WN;
  static constexpr int THREADS = WARPS_M * WARPS_N * 32;
  static constexpr int MI = WM / 16, NJ = WN / 8;
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0, "tile shape");
  static_assert(BM % 16 == 0 && BN % 16 == 0, "tiles of 16 keep ldmatrix rows conflict free");
};

// Elements of one shared-memory operand tile (padded rows) and of one pipeline stage.
template <bool KMAJ, int ROWS, int BK>
struct TileShape {
  static constexpr int R = KMAJ ? ROWS : BK;       // shared-memory rows
  static constexpr int C = (KMAJ ? BK : ROWS) + 8;  // padded row length (bf16)
  static constexpr int ELEMS = R * C;
};

template <class C, bool A_KMAJ, bool B_KMAJ>
struct Smem {
  using TA = TileShape<A_KMAJ, C::BM, C::BK>;
  using TB = TileShape<B_KMAJ, C::BN, C::BK>;
  static constexpr int STAGE = TA::ELEMS + TB::ELEMS;
  static constexpr int BYTES = STAGE * C::STAGES * 2;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// d = a (16x16, row) * b (16x8, col) + d, bf16 inputs, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Copy elements [col, col + 8) of global row `row` (nullptr: a zero row) into 8 bf16 of shared memory;
// elements at or past `ncols` are zero.
__device__ __forceinline__ void load8(bf16* dst, const bf16* row, int64_t col, int64_t ncols, bool vec) {
  if (row != nullptr && vec && col + 8 <= ncols) {
    cp_async16(dst, row + col);
    return;
  }
  uint4 u = make_uint4(0u, 0u, 0u, 0u);
  if (row != nullptr) {
    unsigned short* s = reinterpret_cast<unsigned short*>(&u);
    const unsigned short* src = reinterpret_cast<const unsigned short*>(row);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      if (col + e < ncols) s[e] = src[col + e];
    }
  }
  *reinterpret_cast<uint4*>(dst) = u;
}

// Loads one operand tile for output rows [r0, r0 + ROWS) and k [k0, k0 + BK) into shared memory.
// (A gathered token row r < n_stage comes from `stage` (leading dimension lds): a fold's carried rows.)
template <bool KMAJ, int ROWS, int BK, int THREADS>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* g, int64_t ld, int64_t nrows, int64_t r0,
                                          int64_t K, int64_t k0, const int32_t* kmap, bool vec,
                                          const bf16* stage = nullptr, int64_t lds = 0, int64_t n_stage = 0) {
  using T = TileShape<KMAJ, ROWS, BK>;
  constexpr int CPR = (T::C - 8) / 8;  // 16-byte chunks per shared-memory row
  constexpr int TOTAL = T::R * CPR;
  for (int i = threadIdx.x; i < TOTAL; i += THREADS) {
    const int r = i / CPR;
    const int c = i - r * CPR;
    bf16* dst = s + r * T::C + c * 8;
    if constexpr (KMAJ) {  // shared row = output row, columns = k
      const int64_t gr = r0 + r;
      load8(dst, gr < nrows ? g + gr * ld : nullptr, k0 + c * 8, K, vec);
    } else {  // shared row = k (a token row when gathered), columns = output rows
      const int64_t k = k0 + r;
      int64_t src = k < K ? k : -1;
      if (kmap != nullptr && src >= 0) src = __ldg(kmap + src);
      const bf16* row = src < 0 ? nullptr : src < n_stage ? stage + src * lds : g + (src - n_stage) * ld;
      load8(dst, row, r0 + c * 8, nrows, vec);
    }
  }
}

// acc[i][j][e] += sum over k of A(m, k) B(n, k) for the warp's (MI x 16) x (NJ x 8) sub-tile of the CTA tile at
// (m0, n0); k in ascending 16-steps over [0, K). `smem` holds STAGES stages (Smem<...>::BYTES bytes).
template <class C, bool A_KMAJ, bool B_KMAJ>
__device__ __forceinline__ void mainloop(float (&acc)[C::MI][C::NJ][4], const GemmArgs& g, int64_t m0, int64_t n0,
                                         bf16* smem) {
  using S = Smem<C, A_KMAJ, B_KMAJ>;
  using TA = typename S::TA;
  using TB = typename S::TB;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int wm0 = (warp / C::WARPS_N) * C::WM;
  const int wn0 = (warp % C::WARPS_N) * C::WN;
  const int64_t nk = (g.K + C::BK - 1) / C::BK;

  auto load_stage = [&](int64_t kt) {
    bf16* sa = smem + (kt % C::STAGES) * S::STAGE;
    bf16* sb = sa + TA::ELEMS;
    load_tile<A_KMAJ, C::BM, C::BK, C::THREADS>(sa, g.a, g.lda, g.M, m0, g.K, kt * C::BK, g.kmap, g.vec_a, g.a_stage,
                                                g.lda_stage, g.n_stage);
    load_tile<B_KMAJ, C::BN, C::BK, C::THREADS>(sb, g.b, g.ldb, g.N, n0, g.K, kt * C::BK, g.kmap, g.vec_b, g.b_stage,
                                                g.ldb_stage, g.n_stage);
  };

#pragma unroll
  for (int s = 0; s < C::STAGES - 1; ++s) {
    if (s < nk) load_stage(s);
    cp_async_commit();
  }
  for (int64_t kt = 0; kt < nk; ++kt) {
    cp_async_wait<C::STAGES - 2>();
    __syncthreads();  // stage kt is in shared memory; every warp is done with stage kt - 1
    if (kt + C::STAGES - 1 < nk) load_stage(kt + C::STAGES - 1);
    cp_async_commit();
    const bf16* sa = smem + (kt % C::STAGES) * S::STAGE;
    const bf16* sb = sa + TA::ELEMS;
#pragma unroll
    for (int kk = 0; kk < C::BK; kk += 16) {
      // Exactly ceil(K / 16) mma steps whatever BK is: a zero step past K would turn a -0 accumulator into +0.
      if (kt * C::BK + kk >= g.K) break;
      uint32_t af[C::MI][4];
      uint32_t bfr[C::NJ][2];
#pragma unroll
      for (int i = 0; i < C::MI; ++i) {
        const int m = wm0 + i * 16;
        if constexpr (A_KMAJ) {
          ldmatrix_x4(af[i], sa + (m + (lane & 7) + ((lane >> 3) & 1) * 8) * TA::C + kk + (lane >> 4) * 8);
        } else {
          ldmatrix_x4_trans(af[i], sa + (kk + (lane & 7) + (lane >> 4) * 8) * TA::C + m + ((lane >> 3) & 1) * 8);
        }
      }
#pragma unroll
      for (int jp = 0; jp < C::NJ / 2; ++jp) {
        const int n = wn0 + jp * 16;
        uint32_t r[4];
        if constexpr (B_KMAJ) {
          ldmatrix_x4(r, sb + (n + (lane & 7) + (lane >> 4) * 8) * TB::C + kk + ((lane >> 3) & 1) * 8);
        } else {
          ldmatrix_x4_trans(r, sb + (kk + (lane & 7) + ((lane >> 3) & 1) * 8) * TB::C + n + (lane >> 4) * 8);
        }
        bfr[2 * jp][0] = r[0];
        bfr[2 * jp][1] = r[1];
        bfr[2 * jp + 1][0] = r[2];
        bfr[2 * jp + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < C::MI; ++i) {
#pragma unroll
        for (int j = 0; j < C::NJ; ++j) mma_bf16(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // shared memory free for the caller (epilogue staging or the next mainloop)
}

// Position of accumulator element (i, j, e) in the CTA tile: row wm0 + 16i + lane/4 (+8 for e >= 2),
// column wn0 + 8j + 2(lane%4) + (e & 1).
template <class C>
struct Frag {
  int wm0, wn0, lane;
  __device__ __forceinline__ Frag() {
    lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    wm0 = (warp / C::WARPS_N) * C::WM;
    wn0 = (warp % C::WARPS_N) * C::WN;
  }
  __device__ __forceinline__ int row(int i, int e) const { return wm0 + i * 16 + (lane >> 2) + (e >> 1) * 8; }
  __device__ __forceinline__ int col(int j, int e) const { return wn0 + j * 8 + (lane & 3) * 2 + (e & 1); }
};

// Grouped tile order: GROUP_M row tiles share each column tile while it is hot in L2.
__device__ __forceinline__ void tile_ids(int64_t pid, int64_t num_m, int64_t num_n, int64_t* pm, int64_t* pn) {
  constexpr int64_t kGroup = 8;
  const int64_t in_group = kGroup * num_n;
  const int64_t first_m = (pid / in_group) * kGroup;
  const int64_t size_m = num_m - first_m < kGroup ? num_m - first_m : kGroup;
  *pm = first_m + (pid % in_group) % size_m;
  *pn = (pid % in_group) / size_m;
}

}  // namespace mma
}  // namespace gs
