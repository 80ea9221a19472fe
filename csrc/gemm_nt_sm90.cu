// x @ W^T on Hopper: the CUTLASS path of gemm_nt (see gemm_sm90.cuh). Its own translation unit so that the
// two CUTLASS GEMM families (nt here, nn in gemm_nn_sm90.cu) compile in parallel.
#include "gemm_sm90.cuh"
#include "gradsweep.h"

namespace gs {

int gemm_sm90_nt(uintptr_t a, uintptr_t b, uintptr_t c, int64_t M, int64_t N, int64_t K, int64_t lda,
                 int64_t ldb, int64_t ldc, int device, uintptr_t stream) {
  // B(k, n) = W[n, k]
  using Layout = cutlass::layout::ColumnMajor;
  return sm90::run_by_m<Layout>(reinterpret_cast<const void*>(a), lda, reinterpret_cast<const void*>(b), ldb,
                                reinterpret_cast<void*>(c), ldc, M, N, K, device,
                                reinterpret_cast<cudaStream_t>(stream));
}

}  // namespace gs
