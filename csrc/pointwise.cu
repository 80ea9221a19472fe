// Element-wise SiLU / SwiGLU (forward and backward) and rotate-half RoPE.
//
// No reduction anywhere: every output element is a fixed sequence of IEEE operations on its own inputs,
// identical in the 16-byte vector path and the scalar path (taken when a pointer is not 16-byte
// aligned), so outputs are invariant under any batching. FP32 math inside, bf16 in and out.
#include "common.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // 16-byte chunks per thread per tensor, all loaded before the first use

// sigmoid(x) and 1 - sigmoid(x) without cancellation or overflow: with t = exp(-|x|) <= 1, they are
// 1/(1+t) and t/(1+t), swapped by the sign of x. Branch-free (selects), so a warp never diverges on signs.
__device__ __forceinline__ void sigmoid_pair(float x, float& s, float& oms) {
  const float t = expf(-fabsf(x));
  const float rd = __frcp_rn(__fadd_rn(1.0f, t));
  const float trd = __fmul_rn(t, rd);
  const bool pos = x >= 0.0f;  // NaN: t, rd, trd are NaN either way
  s = pos ? rd : trd;
  oms = pos ? trd : rd;
}

// d silu / dx = s * (1 + x * (1 - s))
__device__ __forceinline__ float dsilu(float x, float s, float oms) { return __fmul_rn(s, __fmaf_rn(x, oms, 1.0f)); }

struct SiluFwd {
  static constexpr int kIn = 1, kOut = 1;
  __device__ static void apply(const float* in, float* out) {
    float s, oms;
    sigmoid_pair(in[0], s, oms);
    out[0] = __fmul_rn(in[0], s);
  }
};

struct SiluBwd {  // in: x, dy; out: dx
  static constexpr int kIn = 2, kOut = 1;
  __device__ static void apply(const float* in, float* out) {
    float s, oms;
    sigmoid_pair(in[0], s, oms);
    out[0] = __fmul_rn(in[1], dsilu(in[0], s, oms));
  }
};

struct SwigluFwd {  // in: gate, up; out: silu(gate) * up
  static constexpr int kIn = 2, kOut = 1;
  __device__ static void apply(const float* in, float* out) {
    float s, oms;
    sigmoid_pair(in[0], s, oms);
    out[0] = __fmul_rn(__fmul_rn(in[0], s), in[1]);
  }
};

struct SwigluBwd {  // in: gate, up, dy; out: dgate, dup
  static constexpr int kIn = 3, kOut = 2;
  __device__ static void apply(const float* in, float* out) {
    float s, oms;
    sigmoid_pair(in[0], s, oms);
    out[0] = __fmul_rn(__fmul_rn(in[2], in[1]), dsilu(in[0], s, oms));
    out[1] = __fmul_rn(in[2], __fmul_rn(in[0], s));
  }
};

struct Ptrs {
  const bf16* in[3];
  bf16* out[2];
};

// VEC: thread handles kUnroll 16-byte chunks (coalesced: stride blockDim); the n % 8 tail elements go to
// the first threads of the grid. Scalar: the same per element, kUnroll elements per thread.
template <class Op, bool VEC>
__global__ void __launch_bounds__(kThreads) pointwise_kernel(Ptrs p, int64_t n) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x * kUnroll + threadIdx.x;
  if constexpr (VEC) {
    const int64_t nvec = n / 8;
    uint4 in[kUnroll][Op::kIn];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * blockDim.x;
#pragma unroll
      for (int a = 0; a < Op::kIn; ++a) {
        in[u][a] = v < nvec ? __ldg(reinterpret_cast<const uint4*>(p.in[a]) + v) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = base + static_cast<int64_t>(u) * blockDim.x;
      if (v < nvec) {
        float f[Op::kIn][8], o[Op::kOut][8];
#pragma unroll
        for (int a = 0; a < Op::kIn; ++a) unpack8(in[u][a], f[a]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float fi[Op::kIn], fo[Op::kOut];
#pragma unroll
          for (int a = 0; a < Op::kIn; ++a) fi[a] = f[a][e];
          Op::apply(fi, fo);
#pragma unroll
          for (int b = 0; b < Op::kOut; ++b) o[b][e] = fo[b];
        }
#pragma unroll
        for (int b = 0; b < Op::kOut; ++b) reinterpret_cast<uint4*>(p.out[b])[v] = pack8(o[b]);
      }
    }
    const int64_t tail = n - nvec * 8;
    const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (gid < tail) {
      const int64_t i = nvec * 8 + gid;
      float fi[Op::kIn], fo[Op::kOut];
#pragma unroll
      for (int a = 0; a < Op::kIn; ++a) fi[a] = __bfloat162float(p.in[a][i]);
      Op::apply(fi, fo);
#pragma unroll
      for (int b = 0; b < Op::kOut; ++b) p.out[b][i] = __float2bfloat16_rn(fo[b]);
    }
  } else {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
      if (i < n) {
        float fi[Op::kIn], fo[Op::kOut];
#pragma unroll
        for (int a = 0; a < Op::kIn; ++a) fi[a] = __bfloat162float(p.in[a][i]);
        Op::apply(fi, fo);
#pragma unroll
        for (int b = 0; b < Op::kOut; ++b) p.out[b][i] = __float2bfloat16_rn(fo[b]);
      }
    }
  }
}

template <class Op>
int launch_pointwise(const Ptrs& p, int64_t n, int device, uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  bool vec = true;
  for (int a = 0; a < Op::kIn; ++a) vec = vec && aligned16(p.in[a]);
  for (int b = 0; b < Op::kOut; ++b) vec = vec && aligned16(p.out[b]);
  const int64_t units = vec ? n / 8 : n;
  int64_t blocks = (units + static_cast<int64_t>(kThreads) * kUnroll - 1) / (static_cast<int64_t>(kThreads) * kUnroll);
  if (blocks == 0) blocks = 1;  // n < 8: only the tail
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  if (vec) {
    pointwise_kernel<Op, true><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p, n);
  } else {
    pointwise_kernel<Op, false><<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p, n);
  }
  return static_cast<int>(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------------
// RoPE, rotate-half pairs (i, i + d/2): out_i = x_i c - x_{i+d/2} s, out_{i+d/2} = x_{i+d/2} c + x_i s,
// angle = position * theta^(-2i/d) in fp32 from the integer position. The inverse (the VJP) rotates
// by -angle. One block per row; the row's cos/sin table (d/2 entries) is built once in shared memory
// and used by every head.
constexpr int kRopeThreads = 256;

template <bool VEC>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(const bf16* __restrict__ x,
                                                          const int64_t* __restrict__ positions,
                                                          bf16* __restrict__ y, int64_t heads, int64_t head_dim,
                                                          float theta, float sin_sign) {
  extern __shared__ float table[];  // cos[half], sin[half]
  const int64_t row = blockIdx.x;
  const int64_t half = head_dim / 2;
  const bf16* xr = x + row * heads * head_dim;
  bf16* yr = y + row * heads * head_dim;
  const int64_t per_head = VEC ? half / 8 : half;
  const int64_t units = heads * per_head;

  // Issue this thread's first loads before the (slow) table build.
  uint4 a0 = make_uint4(0u, 0u, 0u, 0u), b0 = a0;
  if constexpr (VEC) {
    if (threadIdx.x < units) {
      const int64_t h = threadIdx.x / per_head, c = threadIdx.x % per_head;
      a0 = __ldg(reinterpret_cast<const uint4*>(xr + h * head_dim) + c);
      b0 = __ldg(reinterpret_cast<const uint4*>(xr + h * head_dim + half) + c);
    }
  }
  const float pos = __ll2float_rn(__ldg(positions + row));
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float expo = __fdiv_rn(static_cast<float>(2 * i), static_cast<float>(head_dim));
    const float inv_freq = powf(theta, -expo);
    float s, c;
    sincosf(__fmul_rn(pos, inv_freq), &s, &c);
    table[i] = c;
    table[half + i] = __fmul_rn(sin_sign, s);
  }
  __syncthreads();

  for (int64_t u = threadIdx.x; u < units; u += blockDim.x) {
    const int64_t h = u / per_head, c = u % per_head;
    if constexpr (VEC) {
      uint4 a = a0, b = b0;
      if (u != threadIdx.x) {
        a = __ldg(reinterpret_cast<const uint4*>(xr + h * head_dim) + c);
        b = __ldg(reinterpret_cast<const uint4*>(xr + h * head_dim + half) + c);
      }
      float x1[8], x2[8], o1[8], o2[8];
      unpack8(a, x1);
      unpack8(b, x2);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float cs = table[8 * c + e], sn = table[half + 8 * c + e];
        o1[e] = __fmaf_rn(x1[e], cs, -__fmul_rn(x2[e], sn));
        o2[e] = __fmaf_rn(x2[e], cs, __fmul_rn(x1[e], sn));
      }
      reinterpret_cast<uint4*>(yr + h * head_dim)[c] = pack8(o1);
      reinterpret_cast<uint4*>(yr + h * head_dim + half)[c] = pack8(o2);
    } else {
      const float x1 = __bfloat162float(xr[h * head_dim + c]);
      const float x2 = __bfloat162float(xr[h * head_dim + half + c]);
      const float cs = table[c], sn = table[half + c];
      yr[h * head_dim + c] = __float2bfloat16_rn(__fmaf_rn(x1, cs, -__fmul_rn(x2, sn)));
      yr[h * head_dim + half + c] = __float2bfloat16_rn(__fmaf_rn(x2, cs, __fmul_rn(x1, sn)));
    }
  }
}

}  // namespace

int silu_fwd(uintptr_t x, uintptr_t y, int64_t n, int device, uintptr_t stream) {
  Ptrs p{{reinterpret_cast<const bf16*>(x), nullptr, nullptr}, {reinterpret_cast<bf16*>(y), nullptr}};
  return launch_pointwise<SiluFwd>(p, n, device, stream);
}

int silu_bwd(uintptr_t x, uintptr_t dy, uintptr_t dx, int64_t n, int device, uintptr_t stream) {
  Ptrs p{{reinterpret_cast<const bf16*>(x), reinterpret_cast<const bf16*>(dy), nullptr},
         {reinterpret_cast<bf16*>(dx), nullptr}};
  return launch_pointwise<SiluBwd>(p, n, device, stream);
}

int swiglu_fwd(uintptr_t gate, uintptr_t up, uintptr_t y, int64_t n, int device, uintptr_t stream) {
  Ptrs p{{reinterpret_cast<const bf16*>(gate), reinterpret_cast<const bf16*>(up), nullptr},
         {reinterpret_cast<bf16*>(y), nullptr}};
  return launch_pointwise<SwigluFwd>(p, n, device, stream);
}

int swiglu_bwd(uintptr_t gate, uintptr_t up, uintptr_t dy, uintptr_t dgate, uintptr_t dup, int64_t n, int device,
               uintptr_t stream) {
  Ptrs p{{reinterpret_cast<const bf16*>(gate), reinterpret_cast<const bf16*>(up), reinterpret_cast<const bf16*>(dy)},
         {reinterpret_cast<bf16*>(dgate), reinterpret_cast<bf16*>(dup)}};
  return launch_pointwise<SwigluBwd>(p, n, device, stream);
}

int rope(uintptr_t x, uintptr_t positions, uintptr_t y, int64_t rows, int64_t heads, int64_t head_dim, float theta,
         bool inverse, int device, uintptr_t stream) {
  if (rows == 0 || heads == 0 || head_dim == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* xp = reinterpret_cast<const bf16*>(x);
  auto* yp = reinterpret_cast<bf16*>(y);
  const auto* pp = reinterpret_cast<const int64_t*>(positions);
  const int64_t half = head_dim / 2;
  const bool vec = half % 8 == 0 && aligned16(xp) && aligned16(yp);
  const int64_t units = heads * (vec ? half / 8 : half);
  int64_t threads = (units + 31) / 32 * 32;
  if (threads > kRopeThreads) threads = kRopeThreads;
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const float sign = inverse ? -1.0f : 1.0f;
  if (vec) {
    rope_kernel<true><<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), smem, s>>>(
        xp, pp, yp, heads, head_dim, theta, sign);
  } else {
    rope_kernel<false><<<static_cast<unsigned>(rows), static_cast<unsigned>(threads), smem, s>>>(
        xp, pp, yp, heads, head_dim, theta, sign);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
