"""Per-token RL loss fragments in CUDA C++ (gradsweep._C, csrc/rl.cu): importance ratio, KL estimators k1/k2/k3,
PPO clipped surrogate, GRPO. Same public API as ``gradsweep.triton_kernels.rl_token``.

Why they are batch-invariant: every output and gradient of a row is an FP32 function of that row's inputs alone
(GRPO's advantage of the row's sample, from the per-sample rewards in a fixed-order loop over its group), each
evaluated in one fixed order of explicit IEEE operations; no value ever crosses rows, so no layout can change a
bit. Pads and fillers (sample < 0 where a sample id is read) produce 0 and take no part in any group statistic.

Inputs may be bf16 (the sweep's cells) or FP32 (a model's log-probs): one launch reads one dtype, so mixed inputs
are widened to FP32 (exact). Outputs are FP32; the gradient of ``logp`` comes back in logp's own dtype, rounded
to nearest even.
"""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt

_CODES = {torch.bfloat16: 0, torch.float32: 1}


def _inputs(*ts: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """Flat contiguous inputs in one dtype the kernels read (bf16 when all are bf16, else FP32) and its code."""
    for t in ts:
        rt.check_tensor("rl input", t, t.dtype)
    if all(t.dtype == torch.bfloat16 for t in ts):
        return [t.contiguous().view(-1) for t in ts], 0
    return [t.float().contiguous().view(-1) for t in ts], 1


def _grad_out(n: int, like: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The gradient buffer in logp's dtype when the kernels write it (bf16 / FP32), else FP32 (cast after)."""
    dtype = like.dtype if like.dtype in _CODES else torch.float32
    return torch.empty(n, dtype=dtype, device=like.device), _CODES[dtype]


def _upstream(g: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor:
    if g is None:
        return torch.zeros(n, dtype=torch.float32, device=device)
    return g.float().contiguous().view(-1)


def _same_shape(logp: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logp {tuple(logp.shape)}; give one value per token")


# --------------------------------------------------------------------------------------------------- ratio
class _RatioFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, old):  # type: ignore[override]
        (lp, old), code = _inputs(logp, old)
        out = torch.empty(lp.shape, dtype=torch.float32, device=lp.device)
        if lp.numel():
            dev, stream = rt.launch(lp)
            rt.ext().rl_ratio_fwd(rt.ptr(lp), rt.ptr(old), rt.ptr(out), lp.numel(), code, dev, stream)
        ctx.save_for_backward(lp, old)
        ctx.code, ctx.shape, ctx.like = code, logp.shape, logp.new_empty(0)
        return out.view(logp.shape)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        lp, old = ctx.saved_tensors
        d, gcode = _grad_out(lp.numel(), ctx.like)
        if lp.numel():
            dev, stream = rt.launch(lp)
            up = _upstream(g, lp.numel(), lp.device)  # held: a strided g's contiguous copy must outlive the launch
            rt.ext().rl_ratio_bwd(rt.ptr(lp), rt.ptr(old), rt.ptr(up), rt.ptr(d), lp.numel(), ctx.code, gcode, dev,
                                  stream)
        return d.view(ctx.shape).to(ctx.like.dtype), None


def importance_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """exp(logp - old_logp) per token, FP32; differentiable w.r.t. logp."""
    _same_shape(logp, old_logp=old_logp)
    return _RatioFn.apply(logp, old_logp)


# ------------------------------------------------------------------------------------------------------ KL
class _KlFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, ref):  # type: ignore[override]
        (lp, ref), code = _inputs(logp, ref)
        outs = [torch.empty(lp.shape, dtype=torch.float32, device=lp.device) for _ in range(3)]
        if lp.numel():
            dev, stream = rt.launch(lp)
            rt.ext().rl_kl_fwd(rt.ptr(lp), rt.ptr(ref), *(rt.ptr(o) for o in outs), lp.numel(), code, dev, stream)
        ctx.save_for_backward(lp, ref)
        ctx.code, ctx.shape, ctx.like = code, logp.shape, logp.new_empty(0)
        return tuple(o.view(logp.shape) for o in outs)

    @staticmethod
    def backward(ctx, g1, g2, g3):  # type: ignore[override]
        lp, ref = ctx.saved_tensors
        n = lp.numel()
        gs = [_upstream(g, n, lp.device) for g in (g1, g2, g3)]
        d, gcode = _grad_out(n, ctx.like)
        if n:
            dev, stream = rt.launch(lp)
            rt.ext().rl_kl_bwd(rt.ptr(lp), rt.ptr(ref), *(rt.ptr(g) for g in gs), rt.ptr(d), n, ctx.code, gcode, dev,
                               stream)
        return d.view(ctx.shape).to(ctx.like.dtype), None


def kl_estimators(logp: torch.Tensor, ref_logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k1, k2, k3) of KL(policy || ref) per token, FP32; differentiable w.r.t. logp."""
    _same_shape(logp, ref_logp=ref_logp)
    return _KlFn.apply(logp, ref_logp)


# ------------------------------------------------------------------------------------------ PPO and GRPO
class _PolicyConfig:
    def __init__(self, num_samples: int, group: int, clip_low: float, clip_high: float, beta: float,
                 adv_eps: float, grouped: bool, kl: bool) -> None:
        self.num_samples, self.group = int(num_samples), int(group)
        self.clip_low, self.clip_high, self.beta, self.adv_eps = (float(clip_low), float(clip_high), float(beta),
                                                                  float(adv_eps))
        self.grouped, self.kl = grouped, kl


def _policy_launch(args: list[torch.Tensor | None], code: int, cfg: _PolicyConfig, g: torch.Tensor | None,
                   out: torch.Tensor, gcode: int) -> None:
    lp, old, ref, adv, sample, rewards = args
    assert lp is not None
    if not lp.numel():
        return
    dev, stream = rt.launch(lp)
    rt.ext().rl_policy(rt.ptr(lp), rt.ptr(old), rt.ptr(ref), rt.ptr(adv), rt.ptr(sample), rt.ptr(rewards),
                       rt.ptr(g), rt.ptr(out), lp.numel(), cfg.num_samples, cfg.group, cfg.clip_low, cfg.clip_high,
                       cfg.beta, cfg.adv_eps, cfg.grouped, cfg.kl, code, gcode, dev, stream)


class _PolicyFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, args, code, cfg):  # type: ignore[override]
        out = torch.empty(logp.numel(), dtype=torch.float32, device=logp.device)
        _policy_launch(args, code, cfg, None, out, 1)
        ctx.args, ctx.code, ctx.cfg, ctx.shape, ctx.like = args, code, cfg, logp.shape, logp.new_empty(0)
        return out.view(logp.shape)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        n = ctx.args[0].numel()
        d, gcode = _grad_out(n, ctx.like)
        _policy_launch(ctx.args, ctx.code, ctx.cfg, _upstream(g, n, d.device), d, gcode)
        return d.view(ctx.shape).to(ctx.like.dtype), None, None, None


def ppo_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float,
             clip_high: float) -> torch.Tensor:
    """PPO's clipped surrogate per token, -min(r A, clip(r, 1 - clip_low, 1 + clip_high) A), FP32."""
    _same_shape(logp, old_logp=old_logp, advantages=advantages)
    (lp, old, adv), code = _inputs(logp, old_logp, advantages)
    cfg = _PolicyConfig(0, 1, clip_low, clip_high, 0.0, 0.0, grouped=False, kl=False)
    return _PolicyFn.apply(logp, [lp, old, None, adv, None, None], code, cfg)


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor, sample: torch.Tensor,
              rewards: torch.Tensor, group_size: int, clip_low: float, clip_high: float, beta: float,
              adv_eps: float) -> torch.Tensor:
    """GRPO per token: the clipped surrogate with the advantage of the row's sample, normalised over its group
    of ``group_size`` consecutive sample ids (``rewards``: FP32, one per logical sample), plus beta k3."""
    _same_shape(logp, old_logp=old_logp, ref_logp=ref_logp, sample=sample)
    if group_size < 1:
        raise ValueError(f"grpo_loss: group_size {group_size}; give at least 1")
    (lp, old, ref), code = _inputs(logp, old_logp, ref_logp)
    ids = sample.to(device=logp.device, dtype=torch.int64).contiguous().view(-1)
    rew = rewards.to(device=logp.device, dtype=torch.float32).contiguous().view(-1)
    cfg = _PolicyConfig(rew.numel(), group_size, clip_low, clip_high, beta, adv_eps, grouped=True, kl=beta != 0.0)
    return _PolicyFn.apply(logp, [lp, old, ref, None, ids, rew], code, cfg)
