"""Per-token RL loss fragments: importance ratio, KL estimators k1/k2/k3, PPO clipped surrogate, GRPO.

Why they are batch-invariant: every output and gradient of a row is a function of that row's inputs alone
(GRPO's advantage of the row's sample, from the per-sample rewards in a fixed-order loop over its group),
computed in FP32 in a fixed order; no value ever crosses rows, so no layout can change a bit. Pads and
fillers (sample < 0 where a sample id is read) produce 0 and take no part in any group statistic.

Inputs may be bf16 (the sweep's cells) or FP32 (a model's log-probs); outputs are FP32; the gradient of
``logp`` comes back in logp's own dtype, rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.triton_kernels._common import FastLaunch, cdiv, loop_bound, to_out

BLOCK = 1024
WARPS = 4


def _grid(n: int) -> tuple[int]:
    return (cdiv(n, BLOCK),)


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1)


# --------------------------------------------------------------------------------------------------- ratio
@triton.jit
def _ratio_fwd_kernel(LP, OLD, OUT, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    lp = tl.load(LP + off, mask=m, other=0.0).to(tl.float32)
    old = tl.load(OLD + off, mask=m, other=0.0).to(tl.float32)
    tl.store(OUT + off, tl.exp(lp - old), mask=m)


@triton.jit
def _ratio_bwd_kernel(LP, OLD, G, D, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    lp = tl.load(LP + off, mask=m, other=0.0).to(tl.float32)
    old = tl.load(OLD + off, mask=m, other=0.0).to(tl.float32)
    g = tl.load(G + off, mask=m, other=0.0).to(tl.float32)
    tl.store(D + off, to_out(g * tl.exp(lp - old), D.dtype.element_ty), mask=m)


_RATIO_FWD = FastLaunch(_ratio_fwd_kernel)
_RATIO_BWD = FastLaunch(_ratio_bwd_kernel)


class _RatioFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old):  # type: ignore[override]
        lp, old = _flat(logp), _flat(old)
        out = torch.empty(lp.shape, dtype=torch.float32, device=lp.device)
        if lp.numel():
            _RATIO_FWD(_grid(lp.numel()), [lp, old, out, lp.numel()], {"BLOCK": BLOCK}, WARPS)
        ctx.save_for_backward(lp, old)
        ctx.shape = logp.shape
        return out.view(logp.shape)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        lp, old = ctx.saved_tensors
        d = torch.empty_like(lp)
        if lp.numel():
            _RATIO_BWD(_grid(lp.numel()), [lp, old, _flat(g.float()), d, lp.numel()], {"BLOCK": BLOCK}, WARPS)
        return d.view(ctx.shape), None


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """exp(logp - old_logp) per token, FP32; differentiable w.r.t. logp."""
    _same_shape(logp, old_logp=old_logp)
    return _RatioFn.apply(logp, old_logp)


# ------------------------------------------------------------------------------------------------------ KL
@triton.jit
def _kl_fwd_kernel(LP, REF, K1, K2, K3, n, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    lp = tl.load(LP + off, mask=m, other=0.0).to(tl.float32)
    ref = tl.load(REF + off, mask=m, other=0.0).to(tl.float32)
    d = ref - lp
    tl.store(K1 + off, -d, mask=m)
    tl.store(K2 + off, 0.5 * d * d, mask=m)
    tl.store(K3 + off, (tl.exp(d) - 1.0) - d, mask=m)


@triton.jit
def _kl_bwd_kernel(LP, REF, G1, G2, G3, D, n, BLOCK: tl.constexpr):
    """dlogp = g1 * 1 + g2 * (logp - ref) + g3 * (1 - exp(ref - logp)), summed in that order."""
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    lp = tl.load(LP + off, mask=m, other=0.0).to(tl.float32)
    ref = tl.load(REF + off, mask=m, other=0.0).to(tl.float32)
    g1 = tl.load(G1 + off, mask=m, other=0.0).to(tl.float32)
    g2 = tl.load(G2 + off, mask=m, other=0.0).to(tl.float32)
    g3 = tl.load(G3 + off, mask=m, other=0.0).to(tl.float32)
    d = ref - lp
    grad = (g1 + g2 * (-d)) + g3 * (1.0 - tl.exp(d))
    tl.store(D + off, to_out(grad, D.dtype.element_ty), mask=m)


_KL_FWD = FastLaunch(_kl_fwd_kernel)
_KL_BWD = FastLaunch(_kl_bwd_kernel)


class _KlFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, ref):  # type: ignore[override]
        lp, ref = _flat(logp), _flat(ref)
        outs = [torch.empty(lp.shape, dtype=torch.float32, device=lp.device) for _ in range(3)]
        if lp.numel():
            _KL_FWD(_grid(lp.numel()), [lp, ref, *outs, lp.numel()], {"BLOCK": BLOCK}, WARPS)
        ctx.save_for_backward(lp, ref)
        ctx.shape = logp.shape
        return tuple(o.view(logp.shape) for o in outs)

    @staticmethod
    def backward(ctx, g1, g2, g3):  # type: ignore[override]
        lp, ref = ctx.saved_tensors
        gs = [_flat(g.float()) if g is not None else torch.zeros(lp.shape, dtype=torch.float32, device=lp.device)
              for g in (g1, g2, g3)]
        d = torch.empty_like(lp)
        if lp.numel():
            _KL_BWD(_grid(lp.numel()), [lp, ref, *gs, d, lp.numel()], {"BLOCK": BLOCK}, WARPS)
        return d.view(ctx.shape), None


def kl_estimators(logp: torch.Tensor, ref_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k1, k2, k3) of KL(policy || ref) per token, FP32; differentiable w.r.t. logp."""
    _same_shape(logp, ref_logp=ref_logp)
    return _KlFn.apply(logp, ref_logp)


# ------------------------------------------------------------------------------------------ PPO and GRPO
@triton.jit
def _advantage(S, REW, off, m, N, GROUP, ADV_EPS):
    """GRPO advantage of each row's sample: fixed-order FP32 mean and unbiased std over its group."""
    s = tl.load(S + off, mask=m, other=-1)
    real = m & (s >= 0)
    s = tl.where(real, s, 0)
    g0 = (s // GROUP) * GROUP
    size = tl.minimum(N - g0, GROUP)
    total = tl.zeros(s.shape, tl.float32)
    for j in range(0, GROUP):
        total += tl.load(REW + g0 + j, mask=real & (j < size), other=0.0)
    mean = total / size.to(tl.float32)
    sq = tl.zeros(s.shape, tl.float32)
    for j in range(0, GROUP):
        dev = tl.load(REW + g0 + j, mask=real & (j < size), other=0.0) - mean
        sq += tl.where(j < size, dev * dev, 0.0)
    std = tl.sqrt(sq / tl.maximum(size - 1, 1).to(tl.float32))
    mine = tl.load(REW + s, mask=real, other=0.0)
    adv = (mine - mean) / (std + ADV_EPS)
    return tl.where(real & (size > 1), adv, 0.0), real


@triton.jit
def _policy_terms(LP, OLD, REF, ADV, S, REW, off, m, N, GROUP, CLIP_LO, CLIP_HI, BETA, ADV_EPS,
                  GROUPED: tl.constexpr, KL: tl.constexpr):
    lp = tl.load(LP + off, mask=m, other=0.0).to(tl.float32)
    old = tl.load(OLD + off, mask=m, other=0.0).to(tl.float32)
    if GROUPED:
        adv, real = _advantage(S, REW, off, m, N, GROUP, ADV_EPS)
    else:
        adv = tl.load(ADV + off, mask=m, other=0.0).to(tl.float32)
        real = m
    r = tl.exp(lp - old)
    clipped = tl.minimum(tl.maximum(r, 1.0 - CLIP_LO), 1.0 + CLIP_HI)
    unclipped_term = r * adv
    # the unclipped term is the min (ties included: inside the range both terms are the same function of r)
    take = unclipped_term <= clipped * adv
    loss = -tl.where(take, unclipped_term, clipped * adv)
    dloss = tl.where(take, -unclipped_term, 0.0)
    if KL:
        d = tl.load(REF + off, mask=m, other=0.0).to(tl.float32) - lp
        e = tl.exp(d)
        loss = loss + BETA * ((e - 1.0) - d)
        dloss = dloss + BETA * (1.0 - e)
    return tl.where(real, loss, 0.0), tl.where(real, dloss, 0.0)


@triton.jit
def _policy_fwd_kernel(LP, OLD, REF, ADV, S, REW, OUT, n, N, GROUP, CLIP_LO, CLIP_HI, BETA, ADV_EPS,
                       GROUPED: tl.constexpr, KL: tl.constexpr, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    loss, _ = _policy_terms(LP, OLD, REF, ADV, S, REW, off, m, N, GROUP, CLIP_LO, CLIP_HI, BETA, ADV_EPS,
                            GROUPED, KL)
    tl.store(OUT + off, loss, mask=m)


@triton.jit
def _policy_bwd_kernel(LP, OLD, REF, ADV, S, REW, G, D, n, N, GROUP, CLIP_LO, CLIP_HI, BETA, ADV_EPS,
                       GROUPED: tl.constexpr, KL: tl.constexpr, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    _, dloss = _policy_terms(LP, OLD, REF, ADV, S, REW, off, m, N, GROUP, CLIP_LO, CLIP_HI, BETA, ADV_EPS,
                             GROUPED, KL)
    g = tl.load(G + off, mask=m, other=0.0).to(tl.float32)
    tl.store(D + off, to_out(g * dloss, D.dtype.element_ty), mask=m)


_POLICY_FWD = FastLaunch(_policy_fwd_kernel)
_POLICY_BWD = FastLaunch(_policy_bwd_kernel)


class _PolicyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old, ref, adv, sample, rewards, cfg):  # type: ignore[override]
        lp = _flat(logp)
        args = [lp, _flat(old), ref, adv, sample, rewards]
        out = torch.empty(lp.shape, dtype=torch.float32, device=lp.device)
        if lp.numel():
            _POLICY_FWD(_grid(lp.numel()), [*args, out, lp.numel(), *cfg.scalars()], cfg.consts(), WARPS)
        ctx.save_for_backward(*args)
        ctx.cfg, ctx.shape = cfg, logp.shape
        return out.view(logp.shape)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        args = ctx.saved_tensors
        cfg = ctx.cfg
        d = torch.empty_like(args[0])
        if d.numel():
            _POLICY_BWD(_grid(d.numel()), [*args, _flat(g.float()), d, d.numel(), *cfg.scalars()], cfg.consts(), WARPS)
        return d.view(ctx.shape), None, None, None, None, None, None


class _PolicyConfig:
    def __init__(self, num_samples: int, group: int, clip_low: float, clip_high: float, beta: float,
                 adv_eps: float, grouped: bool, kl: bool) -> None:
        self.num_samples, self.group = int(num_samples), int(group)
        self.clip_low, self.clip_high, self.beta, self.adv_eps = clip_low, clip_high, beta, adv_eps
        self.grouped, self.kl = grouped, kl

    def scalars(self) -> tuple:
        return (self.num_samples, loop_bound(self.group), float(self.clip_low), float(self.clip_high),
                float(self.beta), float(self.adv_eps))

    def consts(self) -> dict:
        """The policy kernels' constexpr parameters."""
        return {"GROUPED": self.grouped, "KL": self.kl, "BLOCK": BLOCK}


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float,
             clip_high: float) -> torch.Tensor:
    """PPO's clipped surrogate per token, -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), FP32."""
    _same_shape(logp, old_logp=old_logp, advantages=advantages)
    dummy = torch.zeros(1, dtype=torch.float32, device=logp.device)
    cfg = _PolicyConfig(0, 1, clip_low, clip_high, 0.0, 0.0, grouped=False, kl=False)
    return _PolicyFn.apply(logp, old_logp, dummy, _flat(advantages), dummy.to(torch.int64), dummy, cfg)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, sample: torch.Tensor,
              rewards: torch.Tensor, group_size: int, clip_low: float, clip_high: float, beta: float,
              adv_eps: float) -> torch.Tensor:
    """GRPO per token: the clipped surrogate with the advantage of the row's sample, normalised over its group
    of ``group_size`` consecutive sample ids (``rewards``: FP32, one per logical sample), plus beta k3."""
    _same_shape(logp, old_logp=old_logp, ref_logp=ref_logp, sample=sample)
    if group_size < 1:
        raise ValueError(f"grpo_loss: group_size {group_size}; give at least 1")
    cfg = _PolicyConfig(rewards.numel(), group_size, clip_low, clip_high, beta, adv_eps, grouped=True,
                        kl=beta != 0.0)
    dummy = torch.zeros(1, dtype=torch.float32, device=logp.device)
    return _PolicyFn.apply(logp, old_logp, _flat(ref_logp), dummy,
                           _flat(sample.to(device=logp.device, dtype=torch.int64)),
                           _flat(rewards.to(device=logp.device, dtype=torch.float32)), cfg)


def _same_shape(logp: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logp {tuple(logp.shape)}; give one value per token")
