"""What the RL loss fragments share: their per-token inputs, the per-sample rewards and the math in torch.

Every fragment is a per-token op whose per-token output is the loss term; the harness's upstream gradient for
it is the loss reduction itself (``OutputSpec.upstream``: the masked token mean, or the mean over sequences of
each sequence's token mean), so the active-token denominator is fixed by the harness, never by a kernel.
Per-sequence quantities are functions of logical sample identity: a sample's reward is hashed from
``(reward_seed, sample id)``, its GRPO group is ``sample // group_size``, so every layout sees the same values.

The torch functions below are written once and used twice: in float64 as the reference, and in FP32 on the
bf16 inputs as the stock path (what a trainer writes today: log-probs upcast to FP32).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gradsweep.ops.base import OutputSpec, TokenInput
from gradsweep.workload import hashed_uniform, stream_key

LOGP_SCALE = 0.5  # log-prob-like inputs: differences of ~1 put PPO clipping on both sides of the range


def logp_input(name: str = "logp", grad: str | None = None) -> TokenInput:
    """A per-token log-prob input (the policy's own carries the gradient ``dlogp``)."""
    return TokenInput(name, lambda s: (), grad=grad, scale=LOGP_SCALE)


POLICY_LOGP = logp_input("logp", grad="dlogp")


def loss_output(name: str = "loss", reduction: str = "token_mean") -> OutputSpec:
    """A per-token FP32 loss term whose upstream gradient is the harness's loss reduction."""
    return OutputSpec(name, lambda s: (), dtype=torch.float32, upstream=reduction)  # type: ignore[arg-type]


def sample_rewards(seed: int, num_samples: int, device: torch.device | str = "cpu") -> Tensor:
    """One FP32 reward in [0, 1) per logical sample, hashed from (seed, sample id): the same in every layout."""
    sample = torch.arange(num_samples, dtype=torch.int64)
    u = hashed_uniform(stream_key(seed, "reward"), sample, torch.zeros_like(sample), 1)[:, 0]
    return u.to(torch.float32).to(device)


def group_advantages(rewards: Tensor, group_size: int, eps: float) -> Tensor:
    """GRPO advantages: (r - group mean) / (unbiased group std + eps); a group of one sample gets 0.

    Groups are consecutive sample ids ``[g * group_size, (g + 1) * group_size)``; the last may be short.
    """
    n = rewards.shape[0]
    out = torch.zeros_like(rewards)
    for g0 in range(0, n, group_size):
        r = rewards[g0:g0 + group_size]
        if r.shape[0] < 2:
            continue
        out[g0:g0 + r.shape[0]] = (r - r.mean()) / (r.std() + eps)
    return out


def per_row(values: Tensor, sample: Tensor) -> Tensor:
    """A per-sample value for every row (pads and fillers, sample < 0, get 0)."""
    s = sample.to(values.device)
    return torch.where(s >= 0, values[s.clamp(min=0)], torch.zeros((), dtype=values.dtype, device=values.device))


def ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    return torch.exp(logp - old_logp)


def kl_terms(logp: Tensor, ref_logp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Schulman's estimators of KL(policy || ref) from the policy's samples, with d = ref_logp - logp:
    k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d."""
    d = ref_logp - logp
    return -d, 0.5 * d * d, torch.exp(d) - 1.0 - d


def clipped_surrogate(logp: Tensor, old_logp: Tensor, advantages: Tensor, clip_low: float,
                      clip_high: float) -> Tensor:
    """PPO's per-token loss: -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)."""
    r = ratio(logp, old_logp)
    return -torch.minimum(r * advantages, torch.clamp(r, 1.0 - clip_low, 1.0 + clip_high) * advantages)


def grpo_terms(logp: Tensor, old_logp: Tensor, ref_logp: Tensor, sample: Tensor, shape: dict,
               num_samples: int) -> Tensor:
    """GRPO's per-token loss: the clipped surrogate with group-normalised per-sample advantages + beta k3."""
    dtype = logp.dtype
    rewards = sample_rewards(shape["reward_seed"], num_samples, logp.device).to(dtype)
    adv = per_row(group_advantages(rewards, shape["group_size"], shape["adv_eps"]), sample)
    loss = clipped_surrogate(logp, old_logp, adv, shape["clip_low"], shape["clip_high"])
    return loss + shape["beta"] * kl_terms(logp, ref_logp)[2]


def num_samples_of(rows_sample: Tensor) -> int:
    """Logical samples behind a reference call (every logical row is present there)."""
    real = rows_sample[rows_sample >= 0]
    return int(real.max()) + 1 if real.numel() else 0
