// Batch-invariant GEMMs: forward / dX (bf16 out) and the canonical dW fold (fp32 main grad in, out).
//
// gemm_nt: C[M, N] = A[M, K] B[N, K]^T     (x @ W^T: both operands K-major)
//          (bf16 out; on a CC 9.0 device with TMA-aligned operands: the CUTLASS kernels of gemm_sm90.cuh)
// gemm_nn: C[M, N] = A[M, K] B[K, N]        (dY @ W: B N-major); `out` kNnF32Chain: C is fp32 and loaded
//          before the K loop (a chain of calls then keeps one sequential order); kNnF32Add: C += AB (fp32)
// gemm_dw_fold: G[N, K] (fp32, loaded first) += sum over the plan's tokens, tile after tile, of
//          dY[p, n] X[p, k]: a GEMM whose K loop runs over the canonical token tiles (gathered rows,
//          -1 = zero row, masked at the load). No split of K anywhere, so no M-, split- or order-dependent
//          reduction; see mma_gemm.cuh. On a CC 9.0 device: the wgmma fold of gemm_fold_sm90.cu (same bits).
#include "gemm_epilogue.cuh"
#include "gradsweep.h"

namespace gs {

using mma::GemmArgs;

bool sm90_gemm_built() {
#ifdef GS_NO_SM90_GEMM
  return false;
#else
  return true;
#endif
}

bool hopper_gemm(int device) {
  return sm90_gemm_built() && cached_device_attribute(cudaDevAttrComputeCapabilityMajor, device) == 9 &&
         cached_device_attribute(cudaDevAttrComputeCapabilityMinor, device) == 0;
}

int gemm_path(int path, bool aligned, int64_t M, int64_t N, int64_t K, int device) {
  constexpr int64_t kInt32Max = 2147483647LL;
  if (path == kGemmPortable) return 0;
  const bool applies =
      aligned && hopper_gemm(device) && M <= kInt32Max && N <= kInt32Max && K <= kInt32Max && K > 0;
  if (path == kGemmSm90 && !applies) return -static_cast<int>(cudaErrorNotSupported);
  return applies ? 1 : 0;
}

int gemm_nt(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, int device, uintptr_t stream, int path) {
  if (M == 0 || N == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* ap = reinterpret_cast<const bf16*>(a);
  const auto* bp = reinterpret_cast<const bf16*>(b);
  auto* cp = reinterpret_cast<bf16*>(c);
  const bool vec_a = mma::vec_ok(ap, lda), vec_b = mma::vec_ok(bp, ldb);
  // TMA moves whole 16-byte chunks of the contiguous extents too (K of A and B, N of C), not only of the strides.
  const bool extents = K % 8 == 0 && N % 8 == 0;
  const int sm90 = gemm_path(path, vec_a && vec_b && mma::vec_ok(cp, ldc) && extents, M, N, K, device);
  if (sm90 < 0) return -sm90;
#ifndef GS_NO_SM90_GEMM
  if (sm90 == 1) return gemm_sm90_nt(a, b, c, M, N, K, lda, ldb, ldc, device, stream);
#endif
  const GemmArgs g{ap, lda, bp, ldb, M, N, K, nullptr, vec_a, vec_b};
  const mma::EpiBf16 epi{cp, ldc, ldc % 2 == 0 && (reinterpret_cast<uintptr_t>(cp) & 3u) == 0};
  return mma::launch_by_m<true, true>(g, epi, reinterpret_cast<cudaStream_t>(stream));
}

int gemm_nn(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, int out, int device, uintptr_t stream, int path) {
  if (M == 0 || N == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* ap = reinterpret_cast<const bf16*>(a);
  const auto* bp = reinterpret_cast<const bf16*>(b);
  // The fp32 chain keeps the mma.sync kernels (its accumulator is loaded before the K loop).
  const bool vec_a = mma::vec_ok(ap, lda), vec_b = mma::vec_ok(bp, ldb);
  const bool aligned = vec_a && vec_b && mma::vec_ok(reinterpret_cast<const void*>(c), ldc) && K % 8 == 0 &&
                       N % 8 == 0;  // (extents as in gemm_nt: K of A, N of B and C)
  const int sm90 = gemm_path(path, aligned && out != kNnF32Chain, M, N, K, device);
  if (sm90 < 0) return -sm90;
#ifndef GS_NO_SM90_GEMM
  if (sm90 == 1 && out == kNnF32Add) return gemm_sm90_nn_f32_add(a, b, c, M, N, K, lda, ldb, ldc, device, stream);
  if (sm90 == 1) return gemm_sm90_nn(a, b, c, M, N, K, lda, ldb, ldc, device, stream);
#endif
  const GemmArgs g{ap, lda, bp, ldb, M, N, K, nullptr, vec_a, vec_b};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (out == kNnF32Chain) {
    return mma::launch_by_m<true, false>(g, mma::EpiF32Acc{reinterpret_cast<float*>(c), ldc}, s);
  }
  if (out == kNnF32Add) {
    return mma::launch_by_m<true, false>(g, mma::EpiF32Add{reinterpret_cast<float*>(c), ldc}, s);
  }
  auto* cp = reinterpret_cast<bf16*>(c);
  const mma::EpiBf16 epi{cp, ldc, ldc % 2 == 0 && (reinterpret_cast<uintptr_t>(cp) & 3u) == 0};
  return mma::launch_by_m<true, false>(g, epi, s);
}

int gemm_dw_fold(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t grad,
                 int64_t rows, int64_t N, int64_t K, int64_t ldy, int64_t ldx, int64_t ldg, int device,
                 uintptr_t stream, int path, uintptr_t stage_dy, uintptr_t stage_x, int64_t n_stage,
                 int64_t stage_ldy, int64_t stage_ldx) {
  if (n_tiles == 0 || N == 0 || K == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  // The fold's row space (common.cuh, FoldRows): the carried rows in stage_dy / stage_x, then the call's.
  const FoldRows<bf16> fy = fold_rows<bf16>(stage_dy, dy, n_stage), fx = fold_rows<bf16>(stage_x, x, n_stage);
  if (fy.n_stage == 0) {  // the stage bases are the call's (never read): their checks must pass as the call's do
    stage_ldy = ldy;
    stage_ldx = ldx;
  }
  const int64_t T = n_tiles * tile;
  const bool vec_y = mma::vec_ok(fy.call, ldy) && mma::vec_ok(fy.stage, stage_ldy);
  const bool vec_x = mma::vec_ok(fx.call, ldx) && mma::vec_ok(fx.stage, stage_ldx);
  // The Hopper fold reads token rows by TMA and 16-byte cp.async chunks (16-byte aligned rows).
  const int sm90 = gemm_path(path, vec_y && vec_x, N, K, T, device);
  if (sm90 < 0) return -sm90;
#ifndef GS_NO_SM90_GEMM
  if (sm90 == 1) {
    return gemm_sm90_dw_fold(plan, T, dy, x, grad, rows, N, K, ldy, ldx, ldg, stream,
                             reinterpret_cast<uintptr_t>(fy.stage), reinterpret_cast<uintptr_t>(fx.stage), fy.n_stage,
                             stage_ldy, stage_ldx);
  }
#endif
  // A(n, t) = dY[p(t), n] (M-major), B(k, t) = X[p(t), k] (N-major), reduction over t = plan slots.
  const GemmArgs g{fy.call, ldy, fx.call, ldx, N, K, T, reinterpret_cast<const int32_t*>(plan), vec_y, vec_x,
                   fy.stage, stage_ldy, fx.stage, stage_ldx, fy.n_stage};
  return mma::launch_gemm<mma::CfgLarge, false, false>(g, mma::EpiF32Acc{reinterpret_cast<float*>(grad), ldg},
                                                       reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace gs
