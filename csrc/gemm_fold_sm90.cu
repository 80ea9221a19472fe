// Canonical dW fold on Hopper (sm_90a): G[N, K] (fp32, LOADED first) += sum over the plan's token slots t,
// in ascending t, of dY[p(t), n] X[p(t), k]; wgmma from shared memory, operands loaded by TMA where a stage's
// 64 slots are consecutive token rows followed by zero rows (a canonical tile read in place), else gathered by
// cp.async.
//
// Why not a CUTLASS collective: the fold needs two things CUTLASS's sm90 mainloops do not do. (1) The
// accumulator starts as the main grad (DESIGN.md: the kernel loads it before its reduction loop, so a fold
// split across calls runs the very same chain as one call); CUTLASS's mainloops start from zero. (2) The
// reduction rows come through the plan (token rows in canonical order, -1 = a zero row); TMA on Hopper
// cannot gather rows. So this kernel is written here with CuTe's wgmma atoms and swizzled layouts.
//
// Why it is batch-invariant and equal to the mma.sync fold (gemm.cu, mma_gemm.cuh): every output element
// is one fp32 accumulator register that receives, in ascending t, one wgmma per 16-slot step (a k16 step
// of wgmma m64n256k16), starting from the loaded main grad. No split of the token range anywhere; the
// plan decides which rows are read, never the order of the steps. A step past the plan's end is not
// issued (a zero step would turn a -0 accumulator into +0); -1 rows and columns past N / K are zero-filled
// in shared memory (cp.async with source size 0, TMA's out-of-bounds fill: never read, so a NaN pad row
// cannot leak into 0 * NaN). TMA and cp.async put the same bytes at the same shared addresses, so the
// choice per stage is a speed choice only (the GPU test folds one plan both ways and compares bits).
//
// Pipeline (one CTA per 128 x 256 output tile, warp-specialised): a producer warpgroup fills kStages
// shared-memory stages of 64 token slots. A stage whose plan entries are `count` consecutive rows and then
// -1 (a canonical tile read in place, a sample's short last tile included: what packed, chunked and
// per-sample calls give) is loaded by six TMA boxes of a row-window map whose out-of-bounds rows are the
// tile's zero rows; they complete on the stage's "full" barrier (one thread arrives with the byte count, the
// others plainly). Any other stage (permuted rows; -1 slots inside a tile) is gathered chunk by chunk with
// cp.async, each producer thread's copies arriving on the barrier when they land
// (cp.async.mbarrier.arrive: the producer never waits for its own copies). Why both: measured on the H200
// (notes/kernels_cuda.md), 128 threads issuing 16-byte cp.async bound the kernel near 210-230 TFLOP/s while
// the consumers alone ran at ~600. Two consumer warpgroups (64 rows each) wait for a full stage, fence it
// for the async proxy, run wgmma on it with one batch in flight, and each warp arrives on the stage's
// "empty" barrier once its batch on it has retired. The producer keeps few registers (setmaxnreg), so the
// consumers hold their 128 accumulators without spilling.
//
// The FP32 main-grad tile (128 KiB a CTA, read before the loop and written after it, with the tensor cores idle)
// moves in the widest accesses its alignment allows (`MainGradIO`): 8-byte pairs in (wgmma's C fragment holds
// columns c, c + 1 of a row) and, once the loop is done and the stages are free, out through shared memory as
// coalesced 16-byte row chunks; one element at a time where the leading dimension or the base allows no better.
// The same values land in the same places: the choice moves no bit (the GPU test runs all three against the
// mma.sync fold).
#include <cuda.h>  // CUtensorMap
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "cute/arch/copy_sm90_desc.hpp"
#include "cute/arch/copy_sm90_tma.hpp"
#include "cute/arch/mma_sm90.hpp"
#include "cute/atom/mma_atom.hpp"
#include "cute/tensor.hpp"
#include "cutlass/arch/barrier.h"
#include "cutlass/arch/reg_reconfig.h"
#include "cutlass/numeric_types.h"
#include "fold_sm90_layout.cuh"
#include "gradsweep.h"
#include "tensor_map.cuh"

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
constexpr int kBox = 64;  // columns per TMA box: one 128-byte swizzled row of bf16

// Operands in shared memory are MN-major (a token row of dY / X is contiguous along n / k), 128-byte swizzle.
using SmemLayoutA = FoldSmemLayout<kBM, kBK, kStages>;
using SmemLayoutB = FoldSmemLayout<kBN, kBK, kStages>;
using TiledMma = decltype(make_tiled_mma(
    GMMA::ss_op_selector<Elem, Elem, float, Shape<Int<64>, Int<kBN>, Int<kBK>>, GMMA::Major::MN,
                         GMMA::Major::MN>(),
    Layout<Shape<Int<kBM / 64>, _1, _1>>{}));

constexpr int kSmemA = cosize_v<SmemLayoutA>;
constexpr int kSmemB = cosize_v<SmemLayoutB>;
constexpr int kSmemBarrier = (kSmemA + kSmemB) * static_cast<int>(sizeof(Elem));  // barriers after the operands
constexpr int kSmemBytes = kSmemBarrier + 2 * kStages * 8 + 1024;  // + full / empty barriers, alignment slack
constexpr uint32_t kStageBytes = (kBM + kBN) * kBK * sizeof(Elem);  // what a stage's TMA boxes deliver

using FullBarrier = cutlass::arch::ClusterTransactionBarrier;  // producer -> consumers: a stage has landed
using EmptyBarrier = cutlass::arch::ClusterBarrier;            // consumers -> producer: a stage may be refilled

struct Params {
  const int32_t* plan;  // T token slots: a row of the fold's row space (see dy_stage), or -1 (a zero row)
  int64_t T;
  const Elem* dy;  // [rows, N], leading dimension ldy: the call's rows
  int64_t ldy;
  const Elem* x;  // [rows, K], leading dimension ldx
  int64_t ldx;
  // Rows [0, n_stage) of the row space are the carried rows [n_stage, N] / [n_stage, K] (leading dimensions
  // ldy_stage / ldx_stage), read in place (common.cuh, FoldRows); row r >= n_stage is the call's row r - n_stage.
  const Elem* dy_stage;
  int64_t ldy_stage;
  const Elem* x_stage;
  int64_t ldx_stage;
  int64_t n_stage;
  float* g;  // [N, K], leading dimension ldg
  int64_t ldg;
  int64_t N, K;
  int tiles_m, tiles_n;
};

// Arrives on `bar` (as one of its expected arrivals) once every cp.async this thread issued so far has landed.
// (CUTLASS's cpasync_barrier_arrive_noinc and cute::cp_async_wait<0> emit the same instructions without a
// "memory" clobber; these keep the compiler from moving shared-memory accesses across them.)
__device__ __forceinline__ void cp_async_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(cast_smem_ptr_to_uint(bar))
               : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// How the consumers move the main-grad tile (a speed choice from its alignment, made on the host):
//   kElements: one 4-byte access per accumulator element (any leading dimension);
//   kPairs: one 8-byte access per accumulator pair (ldg and K even, the main grad 8-byte aligned);
//   kChunkedStore: kPairs' load, the store through shared memory in 16-byte row chunks (ldg and K multiples of 4,
//     the main grad 16-byte aligned).
enum MainGradIO : int { kElements = 0, kPairs = 1, kChunkedStore = 2 };

// The staging tile of kChunkedStore, over the free stages: kBM rows of kBN floats, each row padded by 8 floats so
// that a half-warp's 8-byte fragment writes (4 rows x 32 bytes) and a quarter-warp's 16-byte row chunks (128
// contiguous bytes) hit distinct banks.
constexpr int kStageLd = kBN + 8;
constexpr int kConsumerThreads = kConsumers * 128;
constexpr int kChunkRows = kConsumerThreads / (kBN / 4);  // tile rows one pass of the consumers' chunks covers
constexpr uint32_t kBarConsumers = 1;                     // named barrier of the consumer warpgroups

__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"r"(kBarConsumers), "r"(kConsumerThreads) : "memory");
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
// 16-byte aligned rows, checked by the dispatch): row r of the row space is `stage`'s row r below n_stage (leading
// dimension lds), else `src`'s row r - n_stage. Why the address is computed here rather than through the
// CuTe tensor: the gather's issue rate bounds these stages, and per thread the chunk column c is fixed and
// the slot advances by a constant, so a chunk costs a shuffle pair, a few integer ops and its cp.async (the
// formula is FoldSmemLayout's, checked against CuTe by tests/test_audit_kernels.py).
template <int ROWS>
__device__ __forceinline__ void load_stage(uint32_t smem, int stage, const Elem* src, int64_t ld,
                                           const Elem* carried, int64_t lds, int64_t n_stage, int64_t extent,
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
  const Elem* carried_col = carried + (bytes > 0 ? col : 0);
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
      const Elem* from = row < n_stage ? carried_col + row * lds : src_col + (row - n_stage) * ld;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(from), "r"(bytes));
    }
  }
}

// Whether stage `rows` reads token rows first .. first + count - 1 in its first `count` slots (count >= 1) and
// zero rows in the others: a canonical tile read in place, a sample's short last tile included. Such a stage
// is loaded by TMA through the row-window maps (see encode_window) when the run lies in one base (the carried
// rows or the call's: `run_base`) and its window start there, first - (kBK - count), is a row; any other stage
// (permuted rows, a -1 slot inside, a short tile at a base's first rows, a run across the two bases) by
// cp.async. Every producer warp reaches the same answer (same plan entries).
__device__ __forceinline__ bool stage_is_run(StagePlan rows, int lane, int32_t& first, int& count) {
  first = __shfl_sync(0xffffffffu, rows.lo, 0);
  const int64_t f = first;
  const uint64_t in_run = static_cast<uint64_t>(__ballot_sync(0xffffffffu, rows.lo == f + lane)) |
                          static_cast<uint64_t>(__ballot_sync(0xffffffffu, rows.hi == f + 32 + lane)) << 32;
  const uint64_t zero = static_cast<uint64_t>(__ballot_sync(0xffffffffu, rows.lo < 0)) |
                        static_cast<uint64_t>(__ballot_sync(0xffffffffu, rows.hi < 0)) << 32;
  count = __popcll(in_run);
  // in_run a prefix of the slots (bits 0 .. count - 1), every other slot a zero row
  return f >= 0 && (in_run & (in_run + 1)) == 0 && zero == ~in_run;
}

// The run of stage_is_run as a window of one base: 1 = the carried rows, 2 = the call's (its first row there in
// `local`), 0 = neither (the cp.async gather reads it).
__device__ __forceinline__ int run_base(const Params& p, int32_t first, int count, int32_t& local) {
  const int64_t skip = kBK - count;
  if (first + count <= p.n_stage) {
    local = first;
    return first >= skip ? 1 : 0;
  }
  local = static_cast<int32_t>(first - p.n_stage);
  return first >= p.n_stage && local >= skip ? 2 : 0;
}

// Stage `stage` <- token rows first .. first + count - 1, then kBK - count zero rows, by TMA: ROWS / kBox boxes
// per operand of the row-window map at window row kBK - count of the window starting at row first - (kBK -
// count); the window's rows past its kBK and the columns past N / K are out of bounds, so TMA writes zeros
// there and reads nothing. Called by one thread, after it announced kStageBytes (whole boxes, out-of-bounds
// elements included) on the stage's full barrier.
template <int ROWS>
__device__ __forceinline__ void tma_stage(const CUtensorMap* map, uint64_t* full, Elem* tile, int stage,
                                          int64_t r0, int32_t first, int count) {
  const int32_t skip = kBK - count;
  CUTE_UNROLL
  for (int a = 0; a < ROWS / kBox; ++a) {
    SM90_TMA_LOAD_3D::copy(map, full, static_cast<uint64_t>(TMA::CacheHintSm90::EVICT_NORMAL),
                           reinterpret_cast<uint8_t*>(tile) + box_offset<ROWS, kBK>(stage, a),
                           static_cast<int32_t>(r0 + a * kBox), skip, first - skip);
  }
}

// G's tile (m0, n0) <- the staging tile, coalesced 16-byte chunks inside G (K a multiple of 4: a chunk is inside
// or outside whole).
__device__ __forceinline__ void store_chunks(const float* staged, const Params& p, int64_t m0, int64_t n0, int ct) {
  const int r = ct / (kBN / 4), c = (ct % (kBN / 4)) * 4;
  CUTE_UNROLL
  for (int pass = 0; pass < kBM / kChunkRows; ++pass) {
    const int row = pass * kChunkRows + r;
    if (m0 + row < p.N && n0 + c < p.K) {
      *reinterpret_cast<float4*>(p.g + (m0 + row) * p.ldg + n0 + c) =
          *reinterpret_cast<const float4*>(staged + row * kStageLd + c);
    }
  }
}

template <int IO>
__global__ void __launch_bounds__(kThreads, 1) fold_kernel(Params p, const __grid_constant__ CUtensorMap tma_dy,
                                                             const __grid_constant__ CUtensorMap tma_x,
                                                             const __grid_constant__ CUtensorMap tma_dy_stage,
                                                             const __grid_constant__ CUtensorMap tma_x_stage) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t pad = (1024u - (cast_smem_ptr_to_uint(smem_raw) & 1023u)) & 1023u;  // the 128-byte swizzle needs 1 KiB
  uint8_t* smem = smem_raw + pad;
  Elem* base = reinterpret_cast<Elem*>(smem);
  Tensor sA = make_tensor(make_smem_ptr(base), SmemLayoutA{});            // (BM, BK, STAGES)
  Tensor sB = make_tensor(make_smem_ptr(base + kSmemA), SmemLayoutB{});  // (BN, BK, STAGES)
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kSmemBarrier);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      FullBarrier::init(full + s, 128);               // every producer thread (+ the TMA bytes of a run stage)
      EmptyBarrier::init(empty + s, kConsumers * 4);  // every consumer warp, once its batch on the stage retired
    }
    cutlass::arch::fence_barrier_init();
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
    const bool leader = threadIdx.x == 0;
    const uint32_t smem_a = cast_smem_ptr_to_uint(base), smem_b = cast_smem_ptr_to_uint(base + kSmemA);
    if (leader) {
      prefetch_tma_descriptor(&tma_dy);
      prefetch_tma_descriptor(&tma_x);
      if (p.n_stage > 0) {
        prefetch_tma_descriptor(&tma_dy_stage);
        prefetch_tma_descriptor(&tma_x_stage);
      }
    }
    StagePlan rows = stage_plan(p.plan, p.T, 0, lane);
    for (int64_t kt = 0; kt < n_stages; ++kt) {
      const StagePlan next = stage_plan(p.plan, p.T, kt + 1, lane);  // in flight while this stage is issued
      const int stage = static_cast<int>(kt % kStages);
      if (kt >= kStages) EmptyBarrier::wait(empty + stage, static_cast<uint32_t>((kt / kStages + 1) & 1));
      int32_t first, local = 0;
      int count;
      const int win = stage_is_run(rows, lane, first, count) ? run_base(p, first, count, local) : 0;
      if (win != 0) {
        if (leader) {
          FullBarrier::arrive_and_expect_tx(full + stage, kStageBytes);
          tma_stage<kBM>(win == 1 ? &tma_dy_stage : &tma_dy, full + stage, base, stage, m0, local, count);
          tma_stage<kBN>(win == 1 ? &tma_x_stage : &tma_x, full + stage, base + kSmemA, stage, n0, local, count);
        } else {
          FullBarrier::arrive(full + stage);
        }
      } else {
        load_stage<kBM>(smem_a, stage, p.dy, p.ldy, p.dy_stage, p.ldy_stage, p.n_stage, p.N, m0, rows);
        load_stage<kBN>(smem_b, stage, p.x, p.ldx, p.x_stage, p.ldx_stage, p.n_stage, p.K, n0, rows);
        cp_async_arrive(full + stage);  // fires once this thread's copies of the stage have landed
      }
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
  if constexpr (IO == kElements) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); ++i) acc(i) = elem_less(tCcG(i), make_shape(p.N, p.K)) ? tCgG(i) : 0.0f;
  } else {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {  // K even: columns c and c + 1 are both inside G or both outside
      const float2 v = elem_less(tCcG(i), make_shape(p.N, p.K)) ? *reinterpret_cast<const float2*>(&tCgG(i))
                                                                  : make_float2(0.0f, 0.0f);
      acc(i) = v.x;
      acc(i + 1) = v.y;
    }
  }

  // Whole stages: no branch between the wgmma instructions of a batch.
  for (int64_t kt = 0; kt < n_full; ++kt) {
    const int stage = static_cast<int>(kt % kStages);
    FullBarrier::wait(full + stage, static_cast<uint32_t>((kt / kStages) & 1));
    cutlass::arch::fence_view_async_shared();  // cp.async stages are written through the generic proxy
    warpgroup_fence_operand(acc);
    warpgroup_arrive();
    cute::gemm(mma, tCrA(_, _, _, stage), tCrB(_, _, _, stage), acc);
    warpgroup_commit_batch();
    warpgroup_wait<1>();  // the batch of stage kt - 1 has retired (the whole warp): its slot may be refilled
    warpgroup_fence_operand(acc);
    if (kt > 0 && lane == 0) EmptyBarrier::arrive(empty + (kt - 1) % kStages);
  }
  // The last, partial stage: exactly its (T mod kBK) / 16 steps.
  if (n_full < n_stages) {
    const int stage = static_cast<int>(n_full % kStages);
    FullBarrier::wait(full + stage, static_cast<uint32_t>((n_full / kStages) & 1));
    cutlass::arch::fence_view_async_shared();
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

  if constexpr (IO == kElements) {
    if (m0 + kBM <= p.N && n0 + kBN <= p.K) {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) tCgG(i) = acc(i);
    } else {
      CUTE_UNROLL
      for (int i = 0; i < size(acc); ++i) {
        if (elem_less(tCcG(i), make_shape(p.N, p.K))) tCgG(i) = acc(i);
      }
    }
  } else if constexpr (IO == kPairs) {
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      if (elem_less(tCcG(i), make_shape(p.N, p.K))) {
        *reinterpret_cast<float2*>(&tCgG(i)) = make_float2(acc(i), acc(i + 1));
      }
    }
  } else {
    // Every stage has landed and been read (the last full-barrier wait, then each warpgroup's wgmma wait); the
    // barrier makes sure the other warpgroup's last wgmma is done with them too before they are overwritten.
    float* staged = reinterpret_cast<float*>(smem);
    consumers_sync();
    CUTE_UNROLL
    for (int i = 0; i < size(acc); i += 2) {
      *reinterpret_cast<float2*>(staged + (get<0>(tCcG(i)) - m0) * kStageLd + (get<1>(tCcG(i)) - n0)) =
          make_float2(acc(i), acc(i + 1));
    }
    consumers_sync();
    store_chunks(staged, p, m0, n0, ct);
  }
}

namespace {

// A bf16 operand [rows, cols] (leading dimension ld, 16-byte aligned) as a TMA map of row windows: element
// (c, j, w) is column c of row w + j, for j < kBK (both row dimensions step by ld). A box of kBox columns x kBK
// window rows x 1 window at (c0, j0, w) reads rows w + j0 .. w + kBK - 1 and zero-fills its last j0 rows: a
// short canonical tile by TMA without touching the rows after it (the next sample's, or past the tensor). The
// 128-byte swizzle; out-of-bounds elements read as zero.
// Returns 0 or kTmaEncodeError + the driver's CUresult (error_string names it), as the Hopper GEMM does.
int encode_window(CUtensorMap* map, const void* base, int64_t rows, int64_t cols, int64_t ld) {
  // Plan entries are int32: rows past 2^31 are never addressed.
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(kBK),
                              static_cast<cuuint64_t>(std::min<int64_t>(rows, 1LL << 31))};
  const cuuint64_t row_bytes = static_cast<cuuint64_t>(ld) * sizeof(Elem);
  const cuuint64_t strides[2] = {row_bytes, row_bytes};
  const cuuint32_t box[3] = {kBox, kBK, 1};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult r = encode_tensor_map_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims,
                                             strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r == CUDA_ERROR_NOT_SUPPORTED) return static_cast<int>(cudaErrorNotSupported);
  return r == CUDA_SUCCESS ? 0 : kTmaEncodeError + static_cast<int>(r);
}

// One launch of the fold with main-grad I/O `IO`; the shared-memory opt-in is set once per device and kernel.
// (maps[0..3]: the row windows of the call's dY and X, then of the carried rows' dY and X)
template <MainGradIO IO>
int launch_fold(const Params& p, const CUtensorMap (&maps)[4], unsigned grid, cudaStream_t s) {
  GS_TRY(dynamic_smem_once<fold_kernel<IO>>(kSmemBytes));
  fold_kernel<IO><<<grid, kThreads, kSmemBytes, s>>>(p, maps[0], maps[1], maps[2], maps[3]);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

}  // namespace fold90

int gemm_sm90_dw_fold(uintptr_t plan, int64_t T, uintptr_t dy, uintptr_t x, uintptr_t grad, int64_t rows,
                      int64_t N, int64_t K, int64_t ldy, int64_t ldx, int64_t ldg, uintptr_t stream,
                      uintptr_t stage_dy, uintptr_t stage_x, int64_t n_stage, int64_t stage_ldy, int64_t stage_ldx) {
  using namespace fold90;
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");
  static_assert(kBM * kStageLd * 4 <= kSmemBarrier, "the staging tile fits over the stages");
  const int64_t tiles_m = (N + kBM - 1) / kBM, tiles_n = (K + kBN - 1) / kBN;
  if (tiles_m * tiles_n > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  Params p{};
  p.plan = reinterpret_cast<const int32_t*>(plan);
  p.T = T;
  p.dy = reinterpret_cast<const Elem*>(dy);
  p.ldy = ldy;
  p.x = reinterpret_cast<const Elem*>(x);
  p.ldx = ldx;
  p.n_stage = n_stage > 0 ? n_stage : 0;  // (no carried rows: the stage bases are the call's, never read)
  p.dy_stage = p.n_stage > 0 ? reinterpret_cast<const Elem*>(stage_dy) : p.dy;
  p.ldy_stage = p.n_stage > 0 ? stage_ldy : ldy;
  p.x_stage = p.n_stage > 0 ? reinterpret_cast<const Elem*>(stage_x) : p.x;
  p.ldx_stage = p.n_stage > 0 ? stage_ldx : ldx;
  p.g = reinterpret_cast<float*>(grad);
  p.ldg = ldg;
  p.N = N;
  p.K = K;
  p.tiles_m = static_cast<int>(tiles_m);
  p.tiles_n = static_cast<int>(tiles_n);
  // Row windows of the call's dY [rows, N] and X [rows, K], then of the carried dY [n_stage, N] and X [n_stage, K].
  // A base with no rows gets no map: no stage's run lies in it (run_base), so its map is never read.
  CUtensorMap maps[4] = {};
  if (rows > 0) {
    int err = encode_window(&maps[0], p.dy, rows, N, ldy);
    if (err == 0) err = encode_window(&maps[1], p.x, rows, K, ldx);
    if (err != 0) return err;  // nothing launched
  }
  if (p.n_stage > 0) {
    int err = encode_window(&maps[2], p.dy_stage, p.n_stage, N, p.ldy_stage);
    if (err == 0) err = encode_window(&maps[3], p.x_stage, p.n_stage, K, p.ldx_stage);
    if (err != 0) return err;
  }
  const uintptr_t g = reinterpret_cast<uintptr_t>(p.g);
  const unsigned grid = static_cast<unsigned>(tiles_m * tiles_n);
  const cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  // The widest main-grad access the alignment of the grad allows (16-byte chunks, 8-byte pairs, elements).
  if (ldg % 4 == 0 && K % 4 == 0 && g % 16 == 0) return launch_fold<kChunkedStore>(p, maps, grid, s);
  if (ldg % 2 == 0 && K % 2 == 0 && g % 8 == 0) return launch_fold<kPairs>(p, maps, grid, s);
  return launch_fold<kElements>(p, maps, grid, s);
}

}  // namespace gs
