// dY @ W on Hopper: the CUTLASS path of gemm_nn (bf16 out) (see gemm_sm90.cuh). Its own translation unit so that the
// two CUTLASS GEMM families (nn here, nt in gemm_nt_sm90.cu) compile in parallel.
#include "gemm_sm90.cuh"
#include "gradsweep.h"

namespace gs {

int gemm_sm90_nn(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t ldb, int64_t ldc, int device, uintptr_t stream) {
  // B(k, n) = b[k * ldb + n]
  using Layout = cutlass::layout::RowMajor;
  return sm90::run_by_m<Layout>(reinterpret_cast<const void*>(a), lda, reinterpret_cast<const void*>(b), ldb,
                                reinterpret_cast<void*>(c), ldc, M, N, K, device,
                                reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace gs
