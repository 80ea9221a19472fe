// Selected-token log-probability from logits: logp[r] = logits[r, t_r] - logsumexp(logits[r]), fp32.
//
// Forward: one block of kLogpThreads threads per row (a constant: never a function of R); thread t owns the
// 8-element chunks t, t + kLogpThreads, ... of the row (16-byte loads when the row is 16-byte aligned,
// element loads otherwise: the same chunks and the same arithmetic either way, so a row whose alignment
// differs between two layouts gets the same bits). Per thread an online log-sum-exp over its chunks in
// order (rescale once per chunk; exponentials on the special-function unit, see add_chunk), then an xor
// butterfly of (max, sum) pairs inside each warp and over the warps. The pair combine is symmetric in its
// operands, so every lane of a butterfly gets the same bits.
// Backward: dlogits[r, v] = g[r] (onehot(v == t_r) - exp(logits[r, v] - lse[r])), element-wise.
// Targets outside [0, V) (e.g. -100 on pad rows) give logp 0 and a zero gradient.
#include "common.cuh"
#include "gradsweep.h"

namespace gs {
namespace {

constexpr int kLogpThreads = 512;
constexpr int kLogpUnroll = 4;  // chunks loaded ahead of their (in-order) processing
constexpr int kBwdThreads = 256;

struct Lse {
  float m, s;
};

// Symmetric combine: swapping (a, b) gives the same bits (fmaxf, __fmul_rn, __fadd_rn are commutative).
__device__ __forceinline__ Lse combine(Lse a, Lse b) {
  const float m = fmaxf(a.m, b.m);
  const float ea = a.m == -INFINITY ? 0.0f : expf(__fsub_rn(a.m, m));
  const float eb = b.m == -INFINITY ? 0.0f : expf(__fsub_rn(b.m, m));
  return {m, __fadd_rn(__fmul_rn(a.s, ea), __fmul_rn(b.s, eb))};
}

__device__ __forceinline__ Lse warp_combine(Lse v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Lse w{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
    v = combine(v, w);
  }
  return v;
}

constexpr float kLog2e = 1.4426950408889634f;

// Adds chunk f's n elements (n <= 8) to the running (max, sum): rescale once when the chunk raises the max, then
// one exp per element, exp(x - m) = 2^(x log2 e - m log2 e) on the special-function unit (an FFMA and an ex2:
// the accurate expf is ~10 instructions, which made this loop compute-bound at ~54% of copy bandwidth).
// An element at -inf adds 2^-inf = +0; a NaN propagates through the sum; +inf makes the sum NaN (inf - inf),
// as the accurate form did.
template <bool FULL>
__device__ __forceinline__ void add_chunk(const float (&f)[8], int n, Lse& acc) {
  float cm = -INFINITY;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (FULL || e < n) cm = fmaxf(cm, f[e]);
  }
  if (cm > acc.m) {
    acc.s = __fmul_rn(acc.s, ex2(__fmul_rn(__fsub_rn(acc.m, cm), kLog2e)));  // acc.m = -inf: 0 * 0
    acc.m = cm;
  }
  // max still -inf: every element so far is -inf (adds 2^-inf = 0) or NaN (kept), so no -inf - -inf is formed
  const float neg_m = acc.m == -INFINITY ? 0.0f : -__fmul_rn(acc.m, kLog2e);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (FULL || e < n) acc.s = __fadd_rn(acc.s, ex2(__fmaf_rn(f[e], kLog2e, neg_m)));
  }
}

template <bool ALIGNED>
__device__ __forceinline__ void row_lse(const bf16* __restrict__ row, int64_t V, Lse& acc) {
  const int64_t nvec = (V + 7) / 8;
  for (int64_t v0 = threadIdx.x; v0 < nvec; v0 += static_cast<int64_t>(kLogpThreads) * kLogpUnroll) {
    uint4 u[kLogpUnroll];
#pragma unroll
    for (int k = 0; k < kLogpUnroll; ++k) {
      const int64_t v = v0 + static_cast<int64_t>(k) * kLogpThreads;
      u[k] = v < nvec ? load_chunk<ALIGNED>(row, v, V) : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < kLogpUnroll; ++k) {
      const int64_t v = v0 + static_cast<int64_t>(k) * kLogpThreads;
      if (v >= nvec) break;
      float f[8];
      unpack8(u[k], f);
      const int64_t left = V - 8 * v;  // elements of this chunk inside the row
      if (left >= 8) {
        add_chunk<true>(f, 8, acc);
      } else {
        add_chunk<false>(f, static_cast<int>(left), acc);
      }
    }
  }
}

__global__ void __launch_bounds__(kLogpThreads) logp_fwd_kernel(const bf16* __restrict__ logits,
                                                                const int64_t* __restrict__ targets,
                                                                float* __restrict__ out, float* __restrict__ lse_out,
                                                                int64_t V, int64_t ld) {
  __shared__ float sm[kLogpThreads / 32], ss[kLogpThreads / 32];
  const int64_t r = blockIdx.x;
  const bf16* row = logits + r * ld;
  Lse acc{-INFINITY, 0.0f};
  if (V % 8 == 0 && (reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    row_lse<true>(row, V, acc);
  } else {
    row_lse<false>(row, V, acc);
  }
  acc = warp_combine(acc);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = acc.m;
    ss[warp] = acc.s;
  }
  __syncthreads();
  if (warp == 0) {
    Lse w = lane < kLogpThreads / 32 ? Lse{sm[lane], ss[lane]} : Lse{-INFINITY, 0.0f};
    w = warp_combine(w);
    if (lane == 0) {
      const float lse = __fadd_rn(w.m, logf(w.s));
      const int64_t t = targets[r];
      const bool hit = t >= 0 && t < V;
      out[r] = hit ? __fsub_rn(__bfloat162float(row[t]), lse) : 0.0f;
      lse_out[r] = lse;
    }
  }
}

// Grid (rows, column blocks): a thread handles one 8-element chunk of one row.
template <bool ALIGNED>
__global__ void __launch_bounds__(kBwdThreads) logp_bwd_kernel(const bf16* __restrict__ logits,
                                                               const int64_t* __restrict__ targets,
                                                               const float* __restrict__ lse,
                                                               const float* __restrict__ g, bf16* __restrict__ d,
                                                               int64_t V, int64_t ld, int64_t ldd) {
  const int64_t r = blockIdx.x;
  const int64_t v = static_cast<int64_t>(blockIdx.y) * kBwdThreads + threadIdx.x;
  if (8 * v >= V) return;
  const int64_t t = targets[r];
  const float gr = (t >= 0 && t < V) ? g[r] : 0.0f;
  const float l = lse[r];
  float f[8];
  unpack8(load_chunk<ALIGNED>(logits + r * ld, v, V), f);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float hot = (8 * v + e == t) ? 1.0f : 0.0f;
    f[e] = __fmul_rn(gr, __fsub_rn(hot, expf(__fsub_rn(f[e], l))));
  }
  store_chunk<ALIGNED>(d + r * ldd, v, V, pack8(f));
}

}  // namespace

int logp_fwd(uintptr_t logits, uintptr_t targets, uintptr_t out, uintptr_t lse, int64_t R, int64_t V, int64_t ld,
             int device, uintptr_t stream) {
  if (R == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  logp_fwd_kernel<<<static_cast<unsigned>(R), kLogpThreads, 0, reinterpret_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const bf16*>(logits), reinterpret_cast<const int64_t*>(targets),
      reinterpret_cast<float*>(out), reinterpret_cast<float*>(lse), V, ld);
  return static_cast<int>(cudaGetLastError());
}

int logp_bwd(uintptr_t logits, uintptr_t targets, uintptr_t lse, uintptr_t g, uintptr_t d, int64_t R, int64_t V,
             int64_t ld, int64_t ldd, int device, uintptr_t stream) {
  if (R == 0 || V == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto* lp = reinterpret_cast<const bf16*>(logits);
  auto* dp = reinterpret_cast<bf16*>(d);
  const bool al = V % 8 == 0 && ld % 8 == 0 && ldd % 8 == 0 && aligned16(lp) && aligned16(dp);
  const dim3 grid(static_cast<unsigned>(R), static_cast<unsigned>(((V + 7) / 8 + kBwdThreads - 1) / kBwdThreads));
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const auto* tp = reinterpret_cast<const int64_t*>(targets);
  const auto* lsp = reinterpret_cast<const float*>(lse);
  const auto* gp = reinterpret_cast<const float*>(g);
  if (al) {
    logp_bwd_kernel<true><<<grid, kBwdThreads, 0, s>>>(lp, tp, lsp, gp, dp, V, ld, ldd);
  } else {
    logp_bwd_kernel<false><<<grid, kBwdThreads, 0, s>>>(lp, tp, lsp, gp, dp, V, ld, ldd);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace gs
