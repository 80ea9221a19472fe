// Host launchers of the RL loss fragments (rl.cu; gradsweep._C), conventions as gradsweep.h.
//
// Every kernel is row-local FP32 math in a fixed order (a sequence sum walks a sample's tokens in position
// order with a pinned block size), so no layout can change a bit. `dtype` codes: 0 = bfloat16, 1 = float32;
// the float inputs of one launch share one dtype, a gradient is written in `gdtype`; upstream gradients,
// rewards and masks are fp32, sample ids int64.
#pragma once

#include <cstdint>

namespace gs {

constexpr int64_t kRlSeqThreads = 256;  // threads of a DPO sequence sum (pinned: the sum's order follows it)

int rl_ratio_fwd(uintptr_t lp, uintptr_t old, uintptr_t out, int64_t n, int dtype, int device, uintptr_t stream);
int rl_ratio_bwd(uintptr_t lp, uintptr_t old, uintptr_t g, uintptr_t d, int64_t n, int dtype, int gdtype, int device,
                 uintptr_t stream);
int rl_kl_fwd(uintptr_t lp, uintptr_t ref, uintptr_t k1, uintptr_t k2, uintptr_t k3, int64_t n, int dtype,
              int device, uintptr_t stream);
int rl_kl_bwd(uintptr_t lp, uintptr_t ref, uintptr_t g1, uintptr_t g2, uintptr_t g3, uintptr_t d, int64_t n,
              int dtype, int gdtype, int device, uintptr_t stream);
// PPO (grouped = false: per-token advantages `adv`, in the inputs' dtype) or GRPO (grouped: the advantage of each
// row's sample from the per-sample `rewards` over groups of `group` consecutive ids; kl adds beta * k3 against
// `ref`). g == 0: forward, out = loss (fp32); else backward, out = g * dloss in gdtype.
int rl_policy(uintptr_t lp, uintptr_t old, uintptr_t ref, uintptr_t adv, uintptr_t sample, uintptr_t rewards,
              uintptr_t g, uintptr_t out, int64_t n, int64_t n_samples, int64_t group, float clip_low,
              float clip_high, float beta, float adv_eps, bool grouped, bool kl, int dtype, int gdtype, int device,
              uintptr_t stream);
// out[s] = sum over positions p < len[s] of (a - b) * mask at row order[start[s] + p] (b, mask optional: 0).
int rl_seq_sum(uintptr_t a, uintptr_t b, uintptr_t mask, uintptr_t order, uintptr_t start, uintptr_t len,
               uintptr_t out, int64_t n_samples, int dtype, int device, uintptr_t stream);
// gseq == 0: out = the DPO pair loss of each row (fp32); else out = dlogp in gdtype (gseq: per-sample sums of
// the upstream gradients). Pairs are samples (2k, 2k + 1); pads and fillers (sample < 0) get 0.
int rl_dpo(uintptr_t seq, uintptr_t gseq, uintptr_t sample, uintptr_t mask, uintptr_t out, int64_t n,
           int64_t n_samples, float beta, int gdtype, int device, uintptr_t stream);

}  // namespace gs
