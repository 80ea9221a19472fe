// Canonical dW fold on Hopper (sm_90a): G[N, K] (fp32, LOADED first) += sum over the plan's token slots t,
// in ascending t, of dY[p(t), n] X[p(t), k]; wgmma from shared memory, operands gathered by cp.async.
//
// Why not a CUTLASS collective: the fold needs two things CUTLASS's sm90 mainloops do not do. (1) The
// accumulator starts as the main grad (DESIGN.md: the kernel loads it before its reduction loop, so a fold
// split across calls runs the very same chain as one call); CUTLASS's mainloops start from zero. (2) The
// reduction rows are gathered through the plan (token rows in canonical order, -1 = a zero row); TMA on
// Hopper cannot gather rows. So this kernel is written here with CuTe's wgmma atoms and swizzled layouts.
//
// Why it is batch-invariant and equal to the mma.sync fold (gemm.cu, mma_gemm.cuh): every output element
// is one fp32 accumulator register that receives, in ascending t, one wgmma per 16-slot step (a k16 step
// of wgmma m64n256k16), starting from the loaded main grad. No split of the token range anywhere; the
// plan decides which rows are read, never the order of the steps. A step past the plan's end is not
// issued (a zero step would turn a -0 accumulator into +0); -1 rows and columns past N / K are zero-filled
// in shared memory (cp.async with source size 0: never read, so a NaN pad row cannot leak into 0 * NaN).
//
// Pipeline (one CTA per 128 x 256 output tile, warp-specialised): a producer warpgroup gathers token rows
// with cp.async into kStages shared-memory stages of 64 token slots; each producer thread's copies of a
// stage arrive on the stage's "full" barrier when they land (cp.async.mbarrier.arrive: the producer never
// waits for its own copies). Two consumer warpgroups (64 rows each) wait for a full stage, fence it for
// the async proxy, run wgmma on it with one batch in flight, and each warp arrives on the stage's "empty"
// barrier once its batch on it has retired. The producer keeps few registers (setmaxnreg), so the
// consumers hold their 128 accumulators without spilling.
#include <cuda_runtime.h>

#include <cstdint>

#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_atom.hpp"
#include "common.cuh"
#include "cute/tensor.hpp"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/numeric_types.h"
#include "fold_sm90_layout.cuh"
#include "gradsweep.h"

namespace gs {
namespace fold90 {

using namespace cute;
using Elem = cutlass::bfloat16_t;

constexpr int kBM = 128;  // rows of G (columns of dY) per CTA
constexpr int kBN = 256;  // columns of G (columns of X) per CTA
constexpr int kBK = kFoldSlotsPerStage;  // token slots per stage
constexpr int kStages = 4;
constexpr int kConsumers = kBM / 64;  // consumer warpgroups, one per 64 rows
constexpr int kThreads = (kConsumers + 1) * 128;  // + the producer warpgroup

// Operands in shared memory are MN-major (a token row of dY / X is contiguous along n / k), 128-byte swizzle.
using SmemLayoutA = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Elem>{},
                                           make_shape(Int<kBM>{}, Int<kBK>{}, Int<kStages>{})));
using SmemLayoutB = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<Elem>{},
                                           make_shape(Int<kBN>{}, Int<kBK>{}, Int<kStages>{})));
using TiledMma = decltype(make_tiled_mma(
    GMMA::ss_op_selector<Elem, Elem, float, Shape<Int<64>, Int<kBN>, Int<kBK>>, GMMA::Major::MN,
                         GMMA::Major::MN>(),
    Layout<Shape<Int<kBM / 64>, _1, _1>>{}));

constexpr int kSmemA = cosize_v<SmemLayoutA>;
constexpr int kSmemB = cosize_v<SmemLayoutB>;
constexpr int kSmemBarrier = (kSmemA + kSmemB) * static_cast<int>(sizeof(Elem));  // barriers after the operands
constexpr int kSmemBytes = kSmemBarrier + 2 * kStages * 8 + 1024;  // + full / empty barriers, alignment slack

struct Params {
  const int32_t* plan;  // T token slots: a row of dY / X, or -1 (a zero row)
  int64_t T;
  const Elem* dy;  // [rows of the batch, N], leading dimension ldy
  int64_t ldy;
  const Elem* x;  // [rows of the batch, K], leading dimension ldx
  int64_t ldx;
  float* g;  // [N, K], leading dimension ldg
  int64_t ldg;
  int64_t N, K;
  int tiles_m, tiles_n;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Arrives on `bar` (as one of its expected arrivals) once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
// Orders the shared-memory writes this thread has observed (the producer's cp.async, acquired through the
// stage's barrier) before its following wgmma reads them through the async proxy.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

__device__ __forceinline__ void bar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
__device__ __forceinline__ void bar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void bar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "GS_FOLD_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra GS_FOLD_WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

// The plan entries of the 64 slots of stage kt, two per lane: slot t0 + lane (lo) and t0 + 32 + lane (hi);
// -1 past the plan's end. Loaded a stage ahead, so the gather's addresses never wait on a plan load.
struct StagePlan {
  int32_t lo, hi;
};
__device__ __forceinline__ StagePlan stage_plan(const int32_t* plan, int64_t T, int64_t kt, int lane) {
  const int64_t s = kt * kBK + lane;
  return {s < T ? __ldg(plan + s) : -1, s + 32 < T ? __ldg(plan + s + 32) : -1};
}

// Stage `stage` of an operand tile (ROWS output rows x kBK token slots, MN-major, 128-byte swizzle, at shared
// address `smem`) <- columns [r0, r0 + ROWS) of the token rows of the stage's plan entries (extent columns;
// 16-byte aligned rows, checked by the dispatch). Why the address is computed here rather than through the
// CuTe tensor: the producer's issue rate bounds the kernel, and per thread the chunk column c is fixed and
// the slot advances by a constant, so a chunk costs a shuffle pair, a few integer ops and its cp.async.
// The formula is CuTe's tile_to_shape(Layout_MN_SW128_Atom, (ROWS, kBK, kStages)): 64 x 8 atoms of 1 KiB,
// M-mode atoms first, then the slot's atom, then the stage; inside an atom, slot t is the 128-byte row
// t % 8 whose 16-byte chunks are XOR-swizzled by t % 8 (fold_sm90_layout.cuh, checked against CuTe by
// tests/test_audit_kernels.py).
template <int ROWS>
__device__ __forceinline__ void load_stage(uint32_t smem, int stage, const Elem* src, int64_t ld, int64_t extent,
                                           int64_t r0, StagePlan rows) {
  static_assert(kBK == 64, "two plan entries per lane");
  constexpr int kChunks = ROWS / 8;       // 16-byte chunks per token row
  constexpr int kStep = 128 / kChunks;    // slots between a producer thread's consecutive chunks
  static_assert(128 % kChunks == 0 && kBK % kStep == 0, "whole chunks per producer thread");
  const int c = static_cast<int>(threadIdx.x) % kChunks;  // the producer warpgroup is threads 0 .. 127
  const int t0 = static_cast<int>(threadIdx.x) / kChunks;
  const int64_t col = r0 + c * 8;
  // A whole chunk, the partial chunk at the right edge (its missing elements zero-filled), or none.
  const int bytes = col >= extent ? 0 : col + 8 <= extent ? 16 : static_cast<int>(extent - col) * 2;
  const Elem* src_col = src + (bytes > 0 ? col : 0);
#pragma unroll 4
  for (int j = 0; j < kBK / kStep; ++j) {
    const int t = t0 + j * kStep;
    const int lo = __shfl_sync(0xffffffffu, rows.lo, t & 31);
    const int hi = __shfl_sync(0xffffffffu, rows.hi, t & 31);
    const int row = t < 32 ? lo : hi;
    const uint32_t dst = smem + swizzled_offset<ROWS, kBK>(stage, c, t);
    if (row < 0 || bytes == 0) {  // a zero row, or columns past the edge: 16 zero bytes, nothing read
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;\n" ::"r"(dst), "l"(src));
    } else {
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src_col + row * ld),
                   "r"(bytes));
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) fold_kernel(Params p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (smem_addr(smem_raw) & 1023u)) & 1023u;  // the 128-byte swizzle needs 1 KiB
  uint8_t* smem = smem_raw + pad;
  Elem* base = reinterpret_cast<Elem*>(smem);
  Tensor sA = make_tensor(make_smem_ptr(base), SmemLayoutA{});            // (BM, BK, STAGES)
  Tensor sB = make_tensor(make_smem_ptr(base + kSmemA), SmemLayoutB{});  // (BN, BK, STAGES)
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kSmemBarrier);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      bar_init(full + s, 128);               // every producer thread, once its copies have landed
      bar_init(empty + s, kConsumers * 4);  // every consumer warp, once its batch on the stage retired
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
  }
  __syncthreads();

  // Grouped tile order: 8 row tiles share a column tile while it is hot in L2.
  const int pid = static_cast<int>(blockIdx.x);
  constexpr int kGroup = 8;
  const int in_group = kGroup * p.tiles_n;
  const int first_m = (pid / in_group) * kGroup;
  const int size_m = min(p.tiles_m - first_m, kGroup);
  const int tm = first_m + (pid % in_group) % size_m;
  const int tn = (pid % in_group) / size_m;
  const int64_t m0 = static_cast<int64_t>(tm) * kBM;
  const int64_t n0 = static_cast<int64_t>(tn) * kBN;
  const int64_t n_stages = (p.T + kBK - 1) / kBK;
  const int64_t n_full = p.T / kBK;  // stages whose kBK / 16 steps all lie inside the plan
  const int wg = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / 128, 0);

  if (wg == 0) {  // producer
    cutlass::arch::warpgroup_reg_dealloc<40>();
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const uint32_t smem_a = smem_addr(base), smem_b = smem_addr(base + kSmemA);
    StagePlan rows = stage_plan(p.plan, p.T, 0, lane);
    for (int64_t kt = 0; kt < n_stages; ++kt) {
      const StagePlan next = stage_plan(p.plan, p.T, kt + 1, lane);  // in flight while this stage is issued
      const int stage = static_cast<int>(kt % kStages);
      if (kt >= kStages) bar_wait(empty + stage, static_cast<uint32_t>((kt / kStages + 1) & 1));
      load_stage<kBM>(smem_a, stage, p.dy, p.ldy, p.N, m0, rows);
      load_stage<kBN>(smem_b, stage, p.x, p.ldx, p.K, n0, rows);
      cp_async_arrive(full + stage);  // fires once this thread's copies of the stage have landed
      rows = next;
    }
    cp_async_wait_all();
    return;
  }

  // Consumers: warpgroup wg - 1 owns rows [64 (wg - 1), 64 wg) of the tile.
  cutlass::arch::warpgroup_reg_alloc<232>();
  const int ct = static_cast<int>(threadIdx.x) - 128;  // thread index among the consumers
  const int lane = static_cast<int>(threadIdx.x) & 31;
  TiledMma mma;
  mma.accumulate_ = GMMA::ScaleOut::One;  // every step adds to the accumulator (which starts as the main grad)
  auto wg_mma = mma.get_slice((wg - 1) * 128);
  Tensor tCsA = wg_mma.partition_A(sA);  // (MMA, MMA_M, MMA_K, STAGES)
  Tensor tCsB = wg_mma.partition_B(sB);  // (MMA, MMA_N, MMA_K, STAGES)
  Tensor tCrA = wg_mma.make_fragment_A(tCsA);
  Tensor tCrB = wg_mma.make_fragment_B(tCsB);
  Tensor acc = partition_fragment_C(mma, Shape<Int<kBM>, Int<kBN>>{});

  Tensor mG = make_tensor(make_gmem_ptr(p.g), make_shape(p.N, p.K), make_stride(p.ldg, Int<1>{}));
  Tensor tCgG = mma.get_slice(ct).partition_C(local_tile(mG, Shape<Int<kBM>, Int<kBN>>{}, make_coord(tm, tn)));
  Tensor tCcG = mma.get_slice(ct).partition_C(local_tile(make_identity_tensor(make_shape(p.N, p.K)),
                                                         Shape<Int<kBM>, Int<kBN>>{}, make_coord(tm, tn)));
  // The main grad, loaded before the reduction loop (zero outside G: never stored). One predicated path:
  // a branch here would make ptxas serialise the wgmma pipeline (C7515).
  CUTE_UNROLL
  for (int i = 0; i < size(acc); ++i) acc(i) = elem_less(tCcG(i), make_shape(p.N, p.K)) ? tCgG(i) : 0.0f;

  // Whole stages: no branch between the wgmma instructions of a batch.
  for (int64_t kt = 0; kt < n_full; ++kt) {
    const int stage = static_cast<int>(kt % kStages);
    bar_wait(full + stage, static_cast<uint32_t>((kt / kStages) & 1));
    fence_async_shared();
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    cute::gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // the batch of stage kt - 1 has retired (the whole warp): its slot may be refilled
    warpgroup_fence_operand(acc);
    if (kt > 0 && lane == 0) bar_arrive(empty + (kt - 1) % kStages);
  }
  // The last, partial stage: exactly its (T mod kBK) / 16 steps.
  if (n_full < n_stages) {
    const int stage = static_cast<int>(n_full % kStages);
    bar_wait(full + stage, static_cast<uint32_t>((n_full / kStages) & 1));
    fence_async_shared();
    warpgroup_wait<0>();
    warpgroup_fence_operand(acc);
    const int steps = static_cast<int>((p.T - n_full * kBK) / 16);
    for (int kb = 0; kb < steps; ++kb) {
      warpgroup_arrive();
      cute::gemm(mma, tCrA(_, _, kb, stage), tCrB(_, _, kb, stage), acc);
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc);
    }
  }
  warpgroup_wait<0>();
  warpgroup_fence_operand(acc);

  if (m0 + kBM <= p.N && n0 + kBN <= p.K) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) tCgG(i) = acc(i);
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) {
      if (elem_less(tCcG(i), make_shape(p.N, p.K))) tCgG(i) = acc(i);
    }
  }
}

}  // namespace fold90

int gemm_sm90_dw_fold(uintptr_t plan, int64_t T, uintptr_t dy, uintptr_t x, uintptr_t grad, int64_t N, int64_t K,
                      int64_t ldy, int64_t ldx, int64_t ldg, int device, uintptr_t stream) {
  using namespace fold90;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
  static bool smem_set[64] = {};  // the attribute is per device (context): set once on each
  if (device < 0 || device >= 64) return static_cast<int>(cudaErrorInvalidDevice);
  if (!smem_set[device]) {
    GS_TRY(cudaFuncSetAttribute(fold_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    smem_set[device] = true;
  }
  Params p{reinterpret_cast<const int32_t*>(plan), T,
           reinterpret_cast<const Elem*>(dy), ldy,
           reinterpret_cast<const Elem*>(x), ldx,
           reinterpret_cast<float*>(grad), ldg,
           N, K,
           static_cast<int>((N + kBM - 1) / kBM), static_cast<int>((K + kBN - 1) / kBN)};
  const int64_t tiles = static_cast<int64_t>(p.tiles_m) * p.tiles_n;
  if (tiles > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  fold_kernel<<<static_cast<unsigned>(tiles), kThreads, kSmemBytes, reinterpret_cast<cudaStream_t>(stream)>>>(p);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
