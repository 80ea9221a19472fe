// cuTensorMapEncodeTiled (the driver's TMA descriptor encoder) through one entry-point lookup per process.
//
// Why: the extension links the static CUDA runtime, not libcuda, so driver functions are reached through
// cudaGetDriverEntryPointByVersion. CUTLASS's wrapper (cutlass/cuda_host_adapter.hpp) looks the encoder up on
// every call, i.e. for every TMA descriptor of every GEMM launch; gemm_sm90.cuh points CUTLASS at this
// function instead, and the Hopper fold (gemm_fold_sm90.cu) encodes its own maps with it.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

namespace gs {

// The encoder's type from its declaration (CUTLASS includes cudaTypedefs.h inside namespace cutlass).
using TensorMapEncoder = decltype(&::cuTensorMapEncodeTiled);

// The first encode failure on this thread since the last reset (CUDA_SUCCESS: none). CUTLASS's own call sites
// only print a failed encode and launch anyway, with a descriptor the kernel cannot use (seen under Nsight
// Compute's injection: CUresult 201 for every descriptor, then an illegal instruction that poisons the context):
// gemm_sm90.cuh resets this before it builds a GEMM's parameters and launches nothing after a failure.
inline CUresult& encode_failure() {
  thread_local CUresult first = CUDA_SUCCESS;
  return first;
}

// Tests only (gradsweep._C._fail_next_tma_encodes): the next n encodes fail with CUDA_ERROR_INVALID_VALUE
// without reaching the driver, so the refusal above can be exercised on a GPU where encodes succeed.
inline int& forced_encode_failures() {
  static int n = 0;
  return n;
}

// Same parameters as cuTensorMapEncodeTiled; CUDA_ERROR_NOT_SUPPORTED when the driver has no encoder. A failure
// is also kept in encode_failure().
inline CUresult encode_tensor_map_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                                        const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                        const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill fill) {
  static const TensorMapEncoder encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<TensorMapEncoder>(fn)
               : nullptr;
  }();
  CUresult r = CUDA_ERROR_NOT_SUPPORTED;
  if (forced_encode_failures() > 0) {
    --forced_encode_failures();
    r = CUDA_ERROR_INVALID_VALUE;
  } else if (encode != nullptr) {
    r = encode(map, type, rank, base, dims, strides, box, element_strides, interleave, swizzle, l2, fill);
  }
  if (r != CUDA_SUCCESS && encode_failure() == CUDA_SUCCESS) encode_failure() = r;
  return r;
}

}  // namespace gs
