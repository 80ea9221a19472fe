// Shared device helpers of the gradsweep CUDA family.
//
// Why explicit __fmul_rn / __fadd_rn / __fmaf_rn everywhere: the same element can reach a kernel through
// its 16-byte vector path or its scalar path (depending on pointer alignment, i.e. on the layout), and
// batch invariance needs both paths to do the very same IEEE operations. The build also passes
// -fmad=false so no compiler contraction can differ between two inlined copies of an expression.
#pragma once

#include <cstdint>
#include <type_traits>
#include <cuda.h>  // CUcontext (types only: the extension reaches the driver through entry points)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace gs {

using bf16 = __nv_bfloat16;

// Return the CUDA error code of `expr` (as int) from the enclosing launcher if it failed.
#define GS_TRY(expr)                                      \
  do {                                                    \
    cudaError_t gs_err_ = (expr);                         \
    if (gs_err_ != cudaSuccess) return static_cast<int>(gs_err_); \
  } while (0)

// Whether this host thread has a current driver context (true where that cannot be asked). The driver's
// cuCtxGetCurrent, looked up once per process (the extension links the static runtime, not libcuda).
inline bool thread_has_context() {
  using GetCurrent = CUresult (*)(CUcontext*);
  static const GetCurrent get = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess ? reinterpret_cast<GetCurrent>(fn) : nullptr;
  }();
  CUcontext ctx = nullptr;
  return get == nullptr || (get(&ctx) == CUDA_SUCCESS && ctx != nullptr);
}

// Makes `device` current for the launcher's scope and restores the previous device afterwards, so the
// caller's (torch's) notion of the current device is left as it was.
// A thread can have no current context at all: torch's autograd device thread before its first kernel (torch sets
// its device lazily) and any new host thread. cudaGetDevice then reports device 0 without binding anything, and
// a driver call before the first runtime launch (cuTensorMapEncodeTiled for every Hopper GEMM, fold and attention
// kernel) fails with CUDA_ERROR_INVALID_CONTEXT (201). Where the device is already the runtime's but no context is
// current, cudaSetDevice binds its primary context (CUDA 12: it initialises it and makes it current).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    int cur = -1;
    status_ = cudaGetDevice(&cur);
    if (status_ == cudaSuccess && cur != device) {
      status_ = cudaSetDevice(device);
      if (status_ == cudaSuccess) prev_ = cur;
    } else if (status_ == cudaSuccess && !thread_has_context()) {
      status_ = cudaSetDevice(device);
    }
  }
  ~DeviceGuard() {
    if (prev_ >= 0) (void)cudaSetDevice(prev_);  // best effort on the way out; nothing to report to
  }
  cudaError_t status() const { return status_; }

 private:
  int prev_ = -1;
  cudaError_t status_ = cudaSuccess;
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A canonical fold's row space (gradsweep.canonical.FoldStep): rows [0, n_stage) of the staging tensor `stage`
// (rows carried from earlier calls), then the call's own rows (row r >= n_stage is the call's row r - n_stage);
// a row is `ld` elements long in either. The carried rows are read in place beside the call's instead of through a
// concatenated copy of both: a plan entry names the same bytes either way, so no bit moves. With nothing carried,
// n_stage is 0 and `stage` is the call's base (never read).
template <typename T>
struct FoldRows {
  const T* stage;
  const T* call;
  int64_t n_stage;
  // Row r of the row space, its base and index there worked out once for the several tensors of one row space:
  // `carried` = r < n_stage, `local` = r, or r - n_stage.
  __host__ __device__ __forceinline__ const T* at(bool carried, int64_t local, int64_t ld) const {
    return (carried ? stage : call) + local * ld;
  }
};
template <typename T>
inline FoldRows<T> fold_rows(uintptr_t stage, uintptr_t call, int64_t n_stage) {
  const T* c = reinterpret_cast<const T*>(call);
  return {n_stage > 0 ? reinterpret_cast<const T*>(stage) : c, c, n_stage > 0 ? n_stage : 0};
}

// Run `launch(std::true_type{})` when `aligned` (the kernel's 16-byte path), else `launch(std::false_type{})`,
// and return the launch's error code: the aligned / unaligned choice of a launcher written once (the lambda
// reads `decltype(arg)::value` as its kernel's ALIGNED template argument).
template <typename Launch>
int launch_aligned(bool aligned, Launch&& launch) {
  if (aligned) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  return static_cast<int>(cudaGetLastError());
}

// Per-device set-up done once (a kernel's shared-memory attribute belongs to the device's context): one flag per
// device, marked by the caller once its set-up succeeded. Devices past kDevices are never marked (their set-up
// then runs on every call: correct, only slower).
class OncePerDevice {
 public:
  static constexpr int kDevices = 64;
  bool done(int device) const { return device >= 0 && device < kDevices && done_[device]; }
  void mark(int device) {
    if (device >= 0 && device < kDevices) done_[device] = true;
  }

 private:
  bool done_[kDevices] = {};
};

// Kernel K's dynamic shared-memory limit raised to `bytes` once per device: the attribute belongs to the device's
// context and outlives the call, so later launches skip the driver call (each launcher asks its kernel's
// compile-time size, the same on every call). On the current device (the launcher's DeviceGuard set it).
template <auto K>
inline cudaError_t dynamic_smem_once(int bytes) {
  static OncePerDevice set;
  int device = -1;
  const cudaError_t got = cudaGetDevice(&device);
  if (got != cudaSuccess) return got;
  if (set.done(device)) return cudaSuccess;
  const cudaError_t err = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) set.mark(device);
  return err;
}

// An integer attribute of `device` (compute capability, SM count), asked once per device and attribute: the
// GEMM dispatch needs them on every call, and cudaDeviceGetAttribute is not free. 0 when it cannot be asked.
inline int cached_device_attribute(cudaDeviceAttr attr, int device) {
  constexpr int kDevices = 64, kAttrs = 256;
  static int cached[kAttrs][kDevices] = {};
  const int a = static_cast<int>(attr);
  if (device < 0 || device >= kDevices || a < 0 || a >= kAttrs) return 0;
  if (cached[a][device] == 0) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, attr, device) != cudaSuccess) return 0;
    cached[a][device] = v;
  }
  return cached[a][device];
}

// 2^x on the special-function unit (ex2.approx.ftz: 2^-22 relative; -inf -> +0). One instruction, the same
// bits in every kernel that evaluates it on the same input.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 8 bf16 values held as raw bits (4 registers), converted to fp32 on use.
__device__ __forceinline__ void unpack8(const uint4& u, float (&f)[8]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 t = __bfloat1622float2(h[k]);
    f[2 * k] = t.x;
    f[2 * k + 1] = t.y;
  }
}

__device__ __forceinline__ uint4 pack8(const float (&f)[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(f[2 * k], f[2 * k + 1]);
  return u;
}

// Chunk v (elements 8v .. 8v+7) of a row of n elements; elements at or past n read as +0.0.
// ALIGNED: the row start is 16-byte aligned and n % 8 == 0, so one 16-byte load does it.
template <bool ALIGNED>
__device__ __forceinline__ uint4 load_chunk(const bf16* __restrict__ row, int64_t v, int64_t n) {
  if constexpr (ALIGNED) {
    return __ldg(reinterpret_cast<const uint4*>(row) + v);
  } else {
    uint4 u = make_uint4(0u, 0u, 0u, 0u);
    unsigned short* s = reinterpret_cast<unsigned short*>(&u);
    const unsigned short* src = reinterpret_cast<const unsigned short*>(row);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t i = 8 * v + e;
      if (i < n) s[e] = src[i];
    }
    return u;
  }
}

template <bool ALIGNED>
__device__ __forceinline__ void store_chunk(bf16* __restrict__ row, int64_t v, int64_t n, const uint4& u) {
  if constexpr (ALIGNED) {
    reinterpret_cast<uint4*>(row)[v] = u;
  } else {
    const unsigned short* s = reinterpret_cast<const unsigned short*>(&u);
    unsigned short* dst = reinterpret_cast<unsigned short*>(row);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t i = 8 * v + e;
      if (i < n) dst[i] = s[e];
    }
  }
}

// Sum of one value per thread over the block, in an order fixed by blockDim.x alone (a multiple of 32):
// xor butterfly inside each warp (every lane ends with the same bits, IEEE addition being commutative),
// then the same butterfly over the per-warp sums. `smem` holds 32 floats; every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int nwarps = blockDim.x >> 5;
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < nwarps ? smem[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t = __fadd_rn(t, __shfl_xor_sync(0xffffffffu, t, o));
    if (lane == 0) smem[32] = t;
  }
  __syncthreads();
  return smem[32];
}

}  // namespace gs
