// Device discovery and error text, never throwing: the Python side decides what a failure means
// (no driver, no device, unsupported SM) from the cudaError code.
#include <cstdio>
#include <string>

#include "common.cuh"
#include "gradsweep.h"
#include "tensor_map.cuh"

namespace gs {

int device_count(int* count) {
  *count = 0;
  return static_cast<int>(cudaGetDeviceCount(count));
}

int device_info(int device, std::string* name, int* major, int* minor, int* sm_count) {
  cudaDeviceProp prop{};
  GS_TRY(cudaGetDeviceProperties(&prop, device));
  *name = prop.name;
  *major = prop.major;
  *minor = prop.minor;
  *sm_count = prop.multiProcessorCount;
  return 0;
}

int runtime_version(int* version) { return static_cast<int>(cudaRuntimeGetVersion(version)); }

int driver_version(int* version) { return static_cast<int>(cudaDriverGetVersion(version)); }

void fail_next_tma_encodes(int n) { forced_encode_failures() = n > 0 ? n : 0; }

std::string error_string(int code) {
  if (code >= kTmaEncodeError && code < 2 * kTmaEncodeError) {
    return "TmaEncodeFailed (" + std::to_string(code) + "): cuTensorMapEncodeTiled returned CUresult " +
           std::to_string(code - kTmaEncodeError) + " for a TMA descriptor of a Hopper GEMM or dW fold; nothing was launched";
  }
  const auto e = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(e)) + " (" + std::to_string(code) + "): " + cudaGetErrorString(e);
}

std::string build_arch_list() {
#ifdef __CUDA_ARCH_LIST__
#define GS_STR2(x) #x
#define GS_STR(x) GS_STR2(x)
  return GS_STR(__CUDA_ARCH_LIST__);
#else
  return "unknown";
#endif
}

}  // namespace gs
