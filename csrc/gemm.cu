// Batch-invariant GEMMs: forward / dX (bf16 out) and the canonical dW fold (fp32 main grad in, out).
//
// gemm_nt: C[M, N] = A[M, K] B[N, K]^T     (x @ W^T: both operands K-major)
// gemm_nn: C[M, N] = A[M, K] B[K, N]        (dY @ W: B N-major); with `accumulate` C is fp32 and loaded
//          before the K loop (a chain of calls then keeps one sequential order)
// gemm_dw_fold: G[N, K] (fp32, loaded first) += sum over the plan's tokens, tile after tile, of
//          dY[p, n] X[p, k]: a GEMM whose K loop runs over the canonical token tiles (gathered rows,
//          -1 = zero row, masked at the load). No split of K anywhere, so no M-, split- or order-dependent
//          reduction; see mma_gemm.cuh.
#include "gemm_epilogue.cuh"
#include "gradsweep.h"

namespace gs {

using mma::GemmArgs;

int gemm_nt(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, int device, uintptr_t stream) {
  if (M == 0 || N == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* ap = reinterpret_cast<const bf16*>(a);
  const auto* bp = reinterpret_cast<const bf16*>(b);
  auto* cp = reinterpret_cast<bf16*>(c);
  const GemmArgs g{ap, lda, bp, ldb, M, N, K, nullptr, mma::vec_ok(ap, lda), mma::vec_ok(bp, ldb)};
  const mma::EpiBf16 epi{cp, ldc, ldc % 2 == 0 && (reinterpret_cast<uintptr_t>(cp) & 3u) == 0};
  return mma::launch_by_m<true, true>(g, epi, reinterpret_cast<cudaStream_t>(stream));
}

int gemm_nn(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
            int64_t ldc, bool accumulate, int device, uintptr_t stream) {
  if (M == 0 || N == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* ap = reinterpret_cast<const bf16*>(a);
  const auto* bp = reinterpret_cast<const bf16*>(b);
  const GemmArgs g{ap, lda, bp, ldb, M, N, K, nullptr, mma::vec_ok(ap, lda), mma::vec_ok(bp, ldb)};
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (accumulate) {
    return mma::launch_by_m<true, false>(g, mma::EpiF32Acc{reinterpret_cast<float*>(c), ldc}, s);
  }
  auto* cp = reinterpret_cast<bf16*>(c);
  const mma::EpiBf16 epi{cp, ldc, ldc % 2 == 0 && (reinterpret_cast<uintptr_t>(cp) & 3u) == 0};
  return mma::launch_by_m<true, false>(g, epi, s);
}

int gemm_dw_fold(uintptr_t plan, int64_t n_tiles, int64_t tile, uintptr_t dy, uintptr_t x, uintptr_t grad,
                 int64_t N, int64_t K, int64_t ldy, int64_t ldx, int64_t ldg, int device, uintptr_t stream) {
  if (n_tiles == 0 || N == 0 || K == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* yp = reinterpret_cast<const bf16*>(dy);
  const auto* xp = reinterpret_cast<const bf16*>(x);
  // A(n, t) = dY[p(t), n] (M-major), B(k, t) = X[p(t), k] (N-major), reduction over t = plan slots.
  const GemmArgs g{yp, ldy, xp, ldx, N, K, n_tiles * tile, reinterpret_cast<const int32_t*>(plan),
                   mma::vec_ok(yp, ldy), mma::vec_ok(xp, ldx)};
  return mma::launch_gemm<mma::CfgLarge, false, false>(g, mma::EpiF32Acc{reinterpret_cast<float*>(grad), ldg},
                                                       reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace gs
