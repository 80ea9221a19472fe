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

// Same parameters as cuTensorMapEncodeTiled; CUDA_ERROR_NOT_SUPPORTED when the driver has no encoder.
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
  if (encode == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  return encode(map, type, rank, base, dims, strides, box, element_strides, interleave, swizzle, l2, fill);
}

}  // namespace gs
