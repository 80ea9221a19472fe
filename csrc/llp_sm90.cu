// linear_logp's fp32 GEMMs on Hopper (CUTLASS, see gemm_sm90.cuh).
// - x @ W^T with fp32 out (its logits): D is the accumulator itself (alpha = 1, no source), so a logit holds the
//   bits of the accumulator of the mma.sync kernel of linear_logp.cu (one chain of 16-wide k steps per element);
//   the row-local reduction then reads it from memory instead of registers.
// - C += A B in fp32 (its dhidden, summed over vocabulary chunks; gemm_nn's kNnF32Add): the chain from zero, then
//   C + acc rounded once, as the mma.sync kernels' EpiF32Add.
// Its own translation unit: it compiles beside the other CUTLASS units.
#include "gemm_sm90.cuh"
#include "gradsweep.h"

namespace gs {

int gemm_sm90_nt_f32(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                     int64_t ldb, int64_t ldc, int device, uintptr_t stream) {
  // B(k, n) = W[n, k]
  using G = sm90::GemmLargeF32<cutlass::layout::ColumnMajor>;
  return sm90::run<G>(reinterpret_cast<const void*>(a), lda, reinterpret_cast<const void*>(b), ldb,
                      reinterpret_cast<void*>(c), ldc, M, N, K, device, reinterpret_cast<cudaStream_t>(stream));
}

int gemm_sm90_nn_f32_add(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                         int64_t ldb, int64_t ldc, int device, uintptr_t stream) {
  // B(k, n) = b[k * ldb + n]
  using G = sm90::GemmLargeF32Add<cutlass::layout::RowMajor>;
  return sm90::run<G>(reinterpret_cast<const void*>(a), lda, reinterpret_cast<const void*>(b), ldb,
                      reinterpret_cast<void*>(c), ldc, M, N, K, device, reinterpret_cast<cudaStream_t>(stream), true);
}

}  // namespace gs
