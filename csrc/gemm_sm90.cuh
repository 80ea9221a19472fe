// Hopper (sm_90a) path of the CUDA family's forward / dX GEMMs: CUTLASS 3.x warp-specialised kernels
// (TMA loads, wgmma m64nNk16 bf16 -> fp32), built from the headers of the pinned `nvidia-cutlass` package.
//
// Why it is batch-invariant: every configuration below is a plain GEMM with ONE accumulator per output
// element and the whole K range in one CTA (no split-K, no stream-K: the tile schedulers are the data-parallel
// persistent one or none). That accumulator receives one wgmma per 16-wide k step in ascending k, so an output
// element sees the same chain of k steps for every M, every tile configuration and every row position; the
// configuration follows M (a speed choice) and never the bits. The epilogue is D = round_bf16(1 * acc) (no
// source C), element-wise. The chain is the one the mma.sync path of mma_gemm.cuh runs (m16n8k16 steps in
// ascending k), so the two paths agree bit for bit (checked by tests/test_cuda_ops.py on the GPU).
//
// Applicability (else the caller runs mma_gemm.cuh): a CC 9.0 device (the sm_90a image), operands and output
// 16-byte aligned with leading dimensions that are multiples of 8 elements (TMA), M, N, K < 2^31.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common.cuh"
#include "gradsweep.h"
#include "tensor_map.cuh"
// CUTLASS encodes a TMA descriptor per operand per launch through cuTensorMapEncodeTiled, by default looking the
// driver function up on every call (cuda_host_adapter.hpp). The "direct call" mode plus this name routes its
// encodes to the once-looked-up encoder (tensor_map.cuh); defined before any CUTLASS header is seen.
#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#define cuTensorMapEncodeTiled ::gs::encode_tensor_map_tiled
#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/kernel_hardware_info.h"

namespace gs {
namespace sm90 {

using cute::Int;
using cute::Shape;

// A CUTLASS GEMM D[M, N] = A[M, K] B[K, N] (bf16 in, fp32 accumulate, ElementD out (bf16, or fp32: D is the
// accumulator itself); ElementC void: no source, else D = C + acc where run() is asked to accumulate).
// LayoutB: cutlass::layout::ColumnMajor for B(k, n) = b[n * ldb + k] (x @ W^T), RowMajor for b[k * ldb + n].
// LayoutA / LayoutD: RowMajor (a[m * lda + k], d[m * ldd + n]) except in the swapped small-M GEMMs below.
template <class LayoutB, class TileShape, class ClusterShape, class KernelSchedule, class EpilogueSchedule,
          class ElementD = cutlass::bfloat16_t, class ElementC = void, class LayoutA_ = cutlass::layout::RowMajor,
          class LayoutD_ = cutlass::layout::RowMajor>
struct Gemm {
  static constexpr bool kHasSource = !cute::is_void_v<ElementC>;
  using Element = cutlass::bfloat16_t;
  using ElementOut = ElementD;
  using LayoutA = LayoutA_;
  using LayoutD = LayoutD_;
  static constexpr int kAlign = 8;                                        // bf16 elements per 16 bytes
  static constexpr int kAlignD = 16 / static_cast<int>(sizeof(ElementD));  // output elements per 16 bytes

  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD, kAlignD, ElementD, LayoutD,
      kAlignD, EpilogueSchedule>::CollectiveOp;

  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Element, LayoutA, kAlign, Element, LayoutB, kAlign,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;

  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Device = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

// A 2-D stride (plus the batch mode) of a CUTLASS stride type: the dynamic mode gets `ld`, the static one is 1.
template <class Stride>
Stride rank2_stride(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<0>(s))>>) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  cute::get<2>(s) = 0;
  return s;
}

// Runs Gemm G on raw pointers; returns a cudaError_t code: cudaErrorNotSupported when CUTLASS refuses the
// problem, an error for the caller like any other (no fallback: gemm.cu's dispatch checks alignment and sizes
// before it picks this path). `accumulate` (a G with a source only): D = D + acc in place (alpha = beta = 1:
// fma(1, C, 1 * acc), i.e. C + acc rounded once).
template <class G>
int run(const void* a, int64_t lda, const void* b, int64_t ldb, void* d, int64_t ldd, int64_t M, int64_t N,
        int64_t K, int device, cudaStream_t stream, bool accumulate = false) {
  using Kernel = typename G::Kernel;
  if (accumulate && !G::kHasSource) return static_cast<int>(cudaErrorNotSupported);
  const auto* src = accumulate ? static_cast<const typename G::ElementOut*>(d) : nullptr;
  typename Kernel::Arguments args{
      cutlass::gemm::GemmUniversalMode::kGemm,
      {static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), 1},
      {static_cast<const typename G::Element*>(a), rank2_stride<typename Kernel::StrideA>(lda),
       static_cast<const typename G::Element*>(b), rank2_stride<typename Kernel::StrideB>(ldb)},
      {{1.0f, accumulate ? 1.0f : 0.0f}, src, rank2_stride<typename Kernel::StrideC>(ldd),
       static_cast<typename G::ElementOut*>(d),
       rank2_stride<typename Kernel::StrideD>(ldd)},
      cutlass::KernelHardwareInfo{device, cached_device_attribute(cudaDevAttrMultiProcessorCount, device)}};
  typename G::Device gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return static_cast<int>(cudaErrorNotSupported);
  if (G::Device::get_workspace_size(args) != 0) return static_cast<int>(cudaErrorNotSupported);  // no split
  // initialize() also sets the kernel's shared-memory attribute (a driver call): once per device and
  // configuration; update() builds the same launch parameters without it.
  static OncePerDevice attribute_set;
  const bool known = attribute_set.done(device);
  encode_failure() = CUDA_SUCCESS;  // the TMA descriptors are encoded inside update() / initialize()
  if ((known ? gemm.update(args) : gemm.initialize(args, nullptr, stream)) != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return static_cast<int>(e != cudaSuccess ? e : cudaErrorLaunchFailure);
  }
  if (encode_failure() != CUDA_SUCCESS) return kTmaEncodeError + static_cast<int>(encode_failure());  // no launch
  attribute_set.mark(device);
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return static_cast<int>(e != cudaSuccess ? e : cudaErrorLaunchFailure);
  }
  return static_cast<int>(cudaGetLastError());
}

// The three configurations, by M (speed only; the bits do not follow them), plus the swapped one above for
// M <= kSwapM. Chosen on the H200 among eleven tile / schedule pairs (notes/kernels_cuda.md, "Hopper GEMM
// configurations"): at M <= 256 a persistent
// ping-pong kernel on 64 x 128 tiles (the producer keeps loading across tiles while the two consumer
// warpgroups alternate: the GEMM streams the weight), above it the cooperative kernel on 128 x 256 tiles,
// and 256 x 128 from M = 8192 (8% faster at M = 16384, N = 4096).
template <class LayoutB>
using GemmSmall = Gemm<LayoutB, Shape<Int<64>, Int<128>, Int<64>>, Shape<Int<1>, Int<1>, Int<1>>,
                       cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized>;
template <class LayoutB>
using GemmLarge = Gemm<LayoutB, Shape<Int<128>, Int<256>, Int<64>>, Shape<Int<1>, Int<1>, Int<1>>,
                       cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                       cutlass::epilogue::TmaWarpSpecializedCooperative>;
// fp32 out (linear_logp's logits, csrc/llp_sm90.cu): the cooperative 128 x 256 configuration at every M (one
// instantiation per B layout; the rows that read it are reduced by a separate, row-local kernel).
template <class LayoutB>
using GemmLargeF32 = Gemm<LayoutB, Shape<Int<128>, Int<256>, Int<64>>, Shape<Int<1>, Int<1>, Int<1>>,
                          cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                          cutlass::epilogue::TmaWarpSpecializedCooperative, float>;
// fp32 C += A B (linear_logp's dhidden, a sum over vocabulary chunks): the same, with an fp32 source.
template <class LayoutB>
using GemmLargeF32Add = Gemm<LayoutB, Shape<Int<128>, Int<256>, Int<64>>, Shape<Int<1>, Int<1>, Int<1>>,
                             cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                             cutlass::epilogue::TmaWarpSpecializedCooperative, float, float>;
template <class LayoutB>
using GemmHuge = Gemm<LayoutB, Shape<Int<256>, Int<128>, Int<64>>, Shape<Int<1>, Int<1>, Int<1>>,
                      cutlass::gemm::KernelTmaWarpSpecializedCooperative,
                      cutlass::epilogue::TmaWarpSpecializedCooperative>;

constexpr int64_t kSmallM = 256;
constexpr int64_t kHugeM = 8192;

// At M <= kSwapM the product runs swapped: D^T[N, M] = B^T[N, K] A^T[K, M]. The weight's rows fill the 64-row
// wgmma tiles (64 CTAs at N = 4096 with every weight box in bounds) and the few token rows are a 16-column tile:
// cuBLAS's kernel time at M = 1 / 16 / 32 where the unswapped 64 x 128 tiles (32 CTAs whose A boxes are mostly
// out of bounds) ran 1.7-2.0x (bench/results/gemm_tiles_2026-12-04/). The bits do not move: an output element
// still receives one wgmma per 16-wide k step in ascending k with the same two bf16 factors per product, only
// which operand the instruction reads as A changes (checked bit for bit against the mma.sync path and against
// the same rows at M = 8192 by tests/test_cuda_ops.py). LayoutA2 is the layout of B^T read as the swapped A.
constexpr int64_t kSwapM = 64;
template <class LayoutA2>
using GemmSwapped = Gemm<cutlass::layout::ColumnMajor, Shape<Int<64>, Int<16>, Int<128>>, Shape<Int<1>, Int<1>, Int<1>>,
                         cutlass::gemm::KernelTmaWarpSpecializedPingpong, cutlass::epilogue::TmaWarpSpecialized,
                         cutlass::bfloat16_t, void, LayoutA2, cutlass::layout::ColumnMajor>;
// B(k, n) = b[n * ldb + k] (ColumnMajor) gives B^T(n, k) row-major, and the other way round.
template <class LayoutB>
using SwappedA = cute::conditional_t<cute::is_same_v<LayoutB, cutlass::layout::ColumnMajor>, cutlass::layout::RowMajor,
                                     cutlass::layout::ColumnMajor>;

// Runs the configuration of M (LayoutB as in Gemm).
template <class LayoutB>
int run_by_m(const void* a, int64_t lda, const void* b, int64_t ldb, void* d, int64_t ldd, int64_t M, int64_t N,
             int64_t K, int device, cudaStream_t stream) {
  // swapped: A^T(k, m) = a[m * lda + k] is a ColumnMajor B with ld lda, D^T(n, m) = d[m * ldd + n] ColumnMajor
  if (M <= kSwapM) return run<GemmSwapped<SwappedA<LayoutB>>>(b, ldb, a, lda, d, ldd, N, M, K, device, stream);
  if (M <= kSmallM) return run<GemmSmall<LayoutB>>(a, lda, b, ldb, d, ldd, M, N, K, device, stream);
  if (M < kHugeM) return run<GemmLarge<LayoutB>>(a, lda, b, ldb, d, ldd, M, N, K, device, stream);
  return run<GemmHuge<LayoutB>>(a, lda, b, ldb, d, ldd, M, N, K, device, stream);
}

}  // namespace sm90
}  // namespace gs
