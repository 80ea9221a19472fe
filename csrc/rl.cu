// RL loss fragments: importance ratio, KL estimators k1/k2/k3, PPO / GRPO clipped surrogate, DPO.
//
// Why they are batch-invariant: a row's outputs and gradient are FP32 functions of that row's inputs alone,
// each evaluated in one fixed order of explicit __f*_rn operations (GRPO's advantage of the row's sample: a
// loop over its group's rewards in id order). The one reduction, a DPO sequence sum, is taken by one block of
// kRlSeqThreads threads per sample that walks the sample's tokens in position order through a host-built index
// map (thread t takes positions t, t + kRlSeqThreads, ...; then the fixed butterfly of block_sum): its order is
// a function of the position alone, never of where the sample sits in the call.
#include <type_traits>

#include "common.cuh"
#include "rl.h"

namespace gs {
namespace rl {

template <class T>
__device__ __forceinline__ float ld(const T* p, int64_t i);
template <>
__device__ __forceinline__ float ld<bf16>(const bf16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <>
__device__ __forceinline__ float ld<float>(const float* p, int64_t i) {
  return p[i];
}

template <class G>
__device__ __forceinline__ void st(G* p, int64_t i, float v);
template <>
__device__ __forceinline__ void st<bf16>(bf16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ void st<float>(float* p, int64_t i, float v) {
  p[i] = v;
}

#define GS_RL_ROWS(i, n)                                                                     \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65536 ? b : 65536);
}

// ------------------------------------------------------------------------------------------- ratio, KL
template <class T>
__global__ void ratio_fwd_kernel(const T* lp, const T* old, float* out, int64_t n) {
  GS_RL_ROWS(i, n) { out[i] = expf(__fsub_rn(ld(lp, i), ld(old, i))); }
}

template <class T, class G>
__global__ void ratio_bwd_kernel(const T* lp, const T* old, const float* g, G* d, int64_t n) {
  GS_RL_ROWS(i, n) { st(d, i, __fmul_rn(g[i], expf(__fsub_rn(ld(lp, i), ld(old, i))))); }
}

template <class T>
__global__ void kl_fwd_kernel(const T* lp, const T* ref, float* k1, float* k2, float* k3, int64_t n) {
  GS_RL_ROWS(i, n) {
    const float d = __fsub_rn(ld(ref, i), ld(lp, i));  // d = ref - logp
    k1[i] = -d;
    k2[i] = __fmul_rn(__fmul_rn(0.5f, d), d);
    k3[i] = __fsub_rn(__fsub_rn(expf(d), 1.0f), d);
  }
}

// dlogp = (g1 + g2 (logp - ref)) + g3 (1 - exp(ref - logp)), in that order.
template <class T, class G>
__global__ void kl_bwd_kernel(const T* lp, const T* ref, const float* g1, const float* g2, const float* g3, G* d,
                              int64_t n) {
  GS_RL_ROWS(i, n) {
    const float dd = __fsub_rn(ld(ref, i), ld(lp, i));
    const float a = __fadd_rn(g1[i], __fmul_rn(g2[i], -dd));
    st(d, i, __fadd_rn(a, __fmul_rn(g3[i], __fsub_rn(1.0f, expf(dd)))));
  }
}

// ------------------------------------------------------------------------------------------- PPO, GRPO
template <class T>
struct PolicyArgs {
  const T* lp;
  const T* old;
  const T* ref;
  const T* adv;
  const int64_t* sample;
  const float* rewards;
  const float* g;
  int64_t n, n_samples, group;
  float clip_low, clip_high, beta, adv_eps;
};

// GRPO advantage of row i's sample: mean and unbiased std over its group in id order (0 for a group of one).
template <class T>
__device__ __forceinline__ float group_advantage(const PolicyArgs<T>& a, int64_t s) {
  const int64_t g0 = (s / a.group) * a.group;
  const int64_t size = a.n_samples - g0 < a.group ? a.n_samples - g0 : a.group;
  if (size < 2) return 0.0f;
  float total = 0.0f;
  for (int64_t j = 0; j < size; ++j) total = __fadd_rn(total, a.rewards[g0 + j]);
  const float mean = __fdiv_rn(total, static_cast<float>(size));
  float sq = 0.0f;
  for (int64_t j = 0; j < size; ++j) {
    const float dev = __fsub_rn(a.rewards[g0 + j], mean);
    sq = __fadd_rn(sq, __fmul_rn(dev, dev));
  }
  const float sd = __fsqrt_rn(__fdiv_rn(sq, static_cast<float>(size - 1)));
  return __fdiv_rn(__fsub_rn(a.rewards[s], mean), __fadd_rn(sd, a.adv_eps));
}

// loss = -min(r A, clip(r, 1 - lo, 1 + hi) A) [+ beta k3]; dloss = d loss / d logp. Pads and fillers: 0, 0.
template <class T, bool GROUPED, bool KL>
__device__ __forceinline__ void policy_terms(const PolicyArgs<T>& a, int64_t i, float* loss, float* dloss) {
  float adv;
  if (GROUPED) {
    const int64_t s = a.sample[i];
    if (s < 0 || s >= a.n_samples) {
      *loss = 0.0f;
      *dloss = 0.0f;
      return;
    }
    adv = group_advantage(a, s);
  } else {
    adv = ld(a.adv, i);
  }
  const float lp = ld(a.lp, i);
  const float r = expf(__fsub_rn(lp, ld(a.old, i)));
  const float clipped = fminf(fmaxf(r, __fsub_rn(1.0f, a.clip_low)), __fadd_rn(1.0f, a.clip_high));
  const float unclipped_term = __fmul_rn(r, adv);
  const float clipped_term = __fmul_rn(clipped, adv);
  // the unclipped term is the min (ties included: inside the range both terms are the same function of r)
  const bool take = unclipped_term <= clipped_term;
  float l = -(take ? unclipped_term : clipped_term);
  float dl = take ? -unclipped_term : 0.0f;
  if (KL) {
    const float d = __fsub_rn(ld(a.ref, i), lp);
    const float e = expf(d);
    l = __fadd_rn(l, __fmul_rn(a.beta, __fsub_rn(__fsub_rn(e, 1.0f), d)));
    dl = __fadd_rn(dl, __fmul_rn(a.beta, __fsub_rn(1.0f, e)));
  }
  *loss = l;
  *dloss = dl;
}

template <class T, class G, bool GROUPED, bool KL>
__global__ void policy_kernel(PolicyArgs<T> a, G* out) {
  GS_RL_ROWS(i, a.n) {
    float loss, dloss;
    policy_terms<T, GROUPED, KL>(a, i, &loss, &dloss);
    if (a.g == nullptr) {
      reinterpret_cast<float*>(out)[i] = loss;
    } else {
      st(out, i, __fmul_rn(a.g[i], dloss));
    }
  }
}

// ------------------------------------------------------------------------------------------- DPO
template <class T>
__global__ void __launch_bounds__(kRlSeqThreads) seq_sum_kernel(const T* a, const T* b, const float* mask,
                                                                const int32_t* order, const int32_t* start,
                                                                const int32_t* len, float* out) {
  __shared__ float red[33];
  const int64_t s = blockIdx.x;
  const int64_t first = start[s];
  const int64_t n = len[s];
  float acc = 0.0f;
  for (int64_t p = threadIdx.x; p < n; p += kRlSeqThreads) {
    const int64_t row = order[first + p];
    float v = ld(a, row);
    if (b != nullptr) v = __fsub_rn(v, ld(b, row));
    if (mask != nullptr) v = __fmul_rn(v, mask[row]);
    acc = __fadd_rn(acc, v);
  }
  const float total = block_sum(acc, red);
  if (threadIdx.x == 0) out[s] = total;
}

template <class G, bool BWD>
__global__ void dpo_kernel(const float* seq, const float* gseq, const int64_t* sample, const float* mask, G* out,
                           int64_t n, int64_t n_samples, float beta) {
  GS_RL_ROWS(i, n) {
    const int64_t s = sample[i];
    const bool real = s >= 0 && s < n_samples;
    const int64_t c = real ? 2 * (s / 2) : 0;
    const float chosen = real ? seq[c] : 0.0f;
    const float rejected = real && c + 1 < n_samples ? seq[c + 1] : 0.0f;
    if (!BWD) {
      const float x = __fmul_rn(-beta, __fsub_rn(chosen, rejected));  // loss = softplus(x)
      const float loss = __fadd_rn(fmaxf(x, 0.0f), log1pf(expf(-fabsf(x))));
      reinterpret_cast<float*>(out)[i] = real ? loss : 0.0f;
    } else {
      const float g_chosen = real ? gseq[c] : 0.0f;
      const float g_rejected = real && c + 1 < n_samples ? gseq[c + 1] : 0.0f;
      const float z = __fmul_rn(beta, __fsub_rn(chosen, rejected));
      const float dz = __fdiv_rn(-1.0f, __fadd_rn(1.0f, expf(z)));
      const float sign = s % 2 == 0 ? beta : -beta;
      const float grad = __fmul_rn(__fmul_rn(__fmul_rn(real ? mask[i] : 0.0f, sign), dz),
                                   __fadd_rn(g_chosen, g_rejected));
      st(out, i, real ? grad : 0.0f);
    }
  }
}

// ------------------------------------------------------------------------------------------- dispatch
template <class F>
int by_dtype(int dtype, F&& f) {
  if (dtype == 0) return f(static_cast<bf16*>(nullptr));
  if (dtype == 1) return f(static_cast<float*>(nullptr));
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace rl

using rl::blocks_for;
using rl::kThreads;

int rl_ratio_fwd(uintptr_t lp, uintptr_t old, uintptr_t out, int64_t n, int dtype, int device, uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return rl::by_dtype(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rl::ratio_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(reinterpret_cast<const T*>(lp),
                                                               reinterpret_cast<const T*>(old),
                                                               reinterpret_cast<float*>(out), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int rl_ratio_bwd(uintptr_t lp, uintptr_t old, uintptr_t g, uintptr_t d, int64_t n, int dtype, int gdtype, int device,
                 uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return rl::by_dtype(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return rl::by_dtype(gdtype, [&](auto gtag) {
      using G = std::remove_pointer_t<decltype(gtag)>;
      rl::ratio_bwd_kernel<T, G><<<blocks_for(n), kThreads, 0, s>>>(
          reinterpret_cast<const T*>(lp), reinterpret_cast<const T*>(old), reinterpret_cast<const float*>(g),
          reinterpret_cast<G*>(d), n);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int rl_kl_fwd(uintptr_t lp, uintptr_t ref, uintptr_t k1, uintptr_t k2, uintptr_t k3, int64_t n, int dtype,
              int device, uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return rl::by_dtype(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rl::kl_fwd_kernel<T><<<blocks_for(n), kThreads, 0, s>>>(
        reinterpret_cast<const T*>(lp), reinterpret_cast<const T*>(ref), reinterpret_cast<float*>(k1),
        reinterpret_cast<float*>(k2), reinterpret_cast<float*>(k3), n);
    return static_cast<int>(cudaGetLastError());
  });
}

int rl_kl_bwd(uintptr_t lp, uintptr_t ref, uintptr_t g1, uintptr_t g2, uintptr_t g3, uintptr_t d, int64_t n,
              int dtype, int gdtype, int device, uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return rl::by_dtype(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    return rl::by_dtype(gdtype, [&](auto gtag) {
      using G = std::remove_pointer_t<decltype(gtag)>;
      rl::kl_bwd_kernel<T, G><<<blocks_for(n), kThreads, 0, s>>>(
          reinterpret_cast<const T*>(lp), reinterpret_cast<const T*>(ref), reinterpret_cast<const float*>(g1),
          reinterpret_cast<const float*>(g2), reinterpret_cast<const float*>(g3), reinterpret_cast<G*>(d), n);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int rl_policy(uintptr_t lp, uintptr_t old, uintptr_t ref, uintptr_t adv, uintptr_t sample, uintptr_t rewards,
              uintptr_t g, uintptr_t out, int64_t n, int64_t n_samples, int64_t group, float clip_low,
              float clip_high, float beta, float adv_eps, bool grouped, bool kl, int dtype, int gdtype, int device,
              uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return rl::by_dtype(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const rl::PolicyArgs<T> a{reinterpret_cast<const T*>(lp), reinterpret_cast<const T*>(old),
                              reinterpret_cast<const T*>(ref), reinterpret_cast<const T*>(adv),
                              reinterpret_cast<const int64_t*>(sample), reinterpret_cast<const float*>(rewards),
                              reinterpret_cast<const float*>(g), n, n_samples, group < 1 ? 1 : group,
                              clip_low, clip_high, beta, adv_eps};
    return rl::by_dtype(g == 0 ? 1 : gdtype, [&](auto gtag) {
      using G = std::remove_pointer_t<decltype(gtag)>;
      G* o = reinterpret_cast<G*>(out);
      if (grouped && kl) rl::policy_kernel<T, G, true, true><<<blocks_for(n), kThreads, 0, s>>>(a, o);
      if (grouped && !kl) rl::policy_kernel<T, G, true, false><<<blocks_for(n), kThreads, 0, s>>>(a, o);
      if (!grouped && kl) rl::policy_kernel<T, G, false, true><<<blocks_for(n), kThreads, 0, s>>>(a, o);
      if (!grouped && !kl) rl::policy_kernel<T, G, false, false><<<blocks_for(n), kThreads, 0, s>>>(a, o);
      return static_cast<int>(cudaGetLastError());
    });
  });
}

int rl_seq_sum(uintptr_t a, uintptr_t b, uintptr_t mask, uintptr_t order, uintptr_t start, uintptr_t len,
               uintptr_t out, int64_t n_samples, int dtype, int device, uintptr_t stream) {
  if (n_samples == 0) return 0;
  if (n_samples > 2147483647LL) return static_cast<int>(cudaErrorInvalidConfiguration);
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  return rl::by_dtype(dtype, [&](auto tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    rl::seq_sum_kernel<T><<<static_cast<unsigned>(n_samples), kRlSeqThreads, 0, s>>>(
        reinterpret_cast<const T*>(a), reinterpret_cast<const T*>(b), reinterpret_cast<const float*>(mask),
        reinterpret_cast<const int32_t*>(order), reinterpret_cast<const int32_t*>(start),
        reinterpret_cast<const int32_t*>(len), reinterpret_cast<float*>(out));
    return static_cast<int>(cudaGetLastError());
  });
}

int rl_dpo(uintptr_t seq, uintptr_t gseq, uintptr_t sample, uintptr_t mask, uintptr_t out, int64_t n,
           int64_t n_samples, float beta, int gdtype, int device, uintptr_t stream) {
  if (n == 0) return 0;
  DeviceGuard guard(device);
  GS_TRY(guard.status());
  const auto s = reinterpret_cast<cudaStream_t>(stream);
  const auto* sq = reinterpret_cast<const float*>(seq);
  const auto* gs_ = reinterpret_cast<const float*>(gseq);
  const auto* smp = reinterpret_cast<const int64_t*>(sample);
  const auto* m = reinterpret_cast<const float*>(mask);
  if (gseq == 0) {
    rl::dpo_kernel<float, false><<<blocks_for(n), kThreads, 0, s>>>(sq, gs_, smp, m, reinterpret_cast<float*>(out),
                                                                    n, n_samples, beta);
    return static_cast<int>(cudaGetLastError());
  }
  return rl::by_dtype(gdtype, [&](auto gtag) {
    using G = std::remove_pointer_t<decltype(gtag)>;
    rl::dpo_kernel<G, true><<<blocks_for(n), kThreads, 0, s>>>(sq, gs_, smp, m, reinterpret_cast<G*>(out), n,
                                                               n_samples, beta);
    return static_cast<int>(cudaGetLastError());
  });
}

}  // namespace gs
