// Host emulation of the CUDA features gradsweep's attention, RL and row-norm kernels use, so their sources run on a CPU
// (tests/cuda_emu/build.py): one std::thread per CUDA thread, std::barrier for __syncthreads and for the warp
// collectives (shuffles, ldmatrix, mma.sync m16n8k16: emu_mma.h), cp.async as plain copies (so a missing
// cp.async wait cannot show here; everything else a kernel computes does). FP32 intrinsics are IEEE host
// operations (built with -ffp-contract=off).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct EmuIdx {
  unsigned x, y, z;
};
inline thread_local EmuIdx emu_thread_idx, emu_block_idx;
inline EmuIdx emu_block_dim, emu_grid_dim;
#define threadIdx emu_thread_idx
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct EmuCta {
  std::barrier<> block;
  std::vector<std::unique_ptr<std::barrier<>>> warp;
  std::vector<unsigned char> smem;
  std::vector<uint64_t> xbuf;
  EmuCta(int threads, int smem_bytes) : block(threads), smem(smem_bytes + 64), xbuf(threads * 16) {
    for (int w = 0; w < threads / 32; ++w) warp.emplace_back(std::make_unique<std::barrier<>>(32));
  }
  unsigned char* shared() {  // 16-byte aligned
    auto p = reinterpret_cast<uintptr_t>(smem.data());
    return smem.data() + ((16 - (p & 15)) & 15);
  }
  // A static __shared__ array (`__shared__ T name[n]`, rewritten by build.py): one buffer per name for the CTA's
  // threads (the first thread to reach the declaration makes it; never initialised, as on the device).
  std::mutex statics_mu;
  std::map<std::string, std::vector<unsigned char>> statics;
  template <class T>
  T* static_shared(const char* name, size_t n) {
    std::lock_guard<std::mutex> lock(statics_mu);
    auto& v = statics[name];
    if (v.empty()) v.resize(n * sizeof(T) + 16);
    auto p = reinterpret_cast<uintptr_t>(v.data());
    return reinterpret_cast<T*>(v.data() + ((16 - (p & 15)) & 15));
  }
};
inline thread_local EmuCta* emu_cta = nullptr;

inline int emu_lane() { return static_cast<int>(threadIdx.x & 31u); }
inline int emu_warp() { return static_cast<int>(threadIdx.x >> 5); }
inline uint64_t* emu_slot(int lane) { return &emu_cta->xbuf[(emu_warp() * 32 + lane) * 16]; }
inline void emu_warp_sync() { emu_cta->warp[emu_warp()]->arrive_and_wait(); }
inline void __syncthreads() { emu_cta->block.arrive_and_wait(); }

inline float __shfl_xor_sync(unsigned, float v, int o) {
  std::memcpy(emu_slot(emu_lane()), &v, 4);
  emu_warp_sync();
  float r;
  std::memcpy(&r, emu_slot(emu_lane() ^ o), 4);
  emu_warp_sync();
  return r;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __frsqrt_rn(float a) { return 1.0f / std::sqrt(a); }  // not correctly rounded: the emulation's own
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __ll2float_rn(long long v) { return static_cast<float>(v); }
inline unsigned __float_as_uint(float x) {
  unsigned u;
  std::memcpy(&u, &x, 4);
  return u;
}
template <class T>
inline T __ldg(const T* p) {
  return *p;
}

// Runs the grid's CTAs one after another (x fastest, then y) on `threads` host threads (created once per
// launch); a block barrier between CTAs keeps a CTA's shared memory its own while it runs.
template <class K, class... Args>
void emu_launch(K kernel, dim3 grid, int threads, int smem, Args... args) {
  emu_block_dim = {static_cast<unsigned>(threads), 1, 1};
  emu_grid_dim = {grid.x, grid.y, 1};
  EmuCta cta(threads, smem < 65536 ? 65536 : smem);  // static __shared__ arrays live here too
  std::vector<std::thread> ts;
  ts.reserve(threads);
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      emu_thread_idx = {static_cast<unsigned>(t), 0, 0};
      emu_cta = &cta;
      for (unsigned by = 0; by < grid.y; ++by) {
        for (unsigned b = 0; b < grid.x; ++b) {
          emu_block_idx = {b, by, 0};
          kernel(args...);
          cta.block.arrive_and_wait();
        }
      }
    });
  }
  for (auto& th : ts) th.join();
}

template <class K, class... Args>
void emu_launch(K kernel, unsigned grid, int threads, int smem, Args... args) {
  emu_launch(kernel, dim3(grid, 1, 1), threads, smem, args...);
}
