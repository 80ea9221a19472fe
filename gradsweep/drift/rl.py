"""The RL loss fragments as the last boundaries of a drift pair: what the drift does to the trainer's loss.

A trainer's RL loss compares its own log-probs (the train role's) with the rollout's (the inference role's):
``old_logp`` and ``ref_logp`` are the rollout's logp in both roles, so with no drift every fragment sees
new == old == ref (ratio 1, KL 0). Each role evaluates each fragment on its own logp as the policy logp, with
the role profile's own candidate (stock torch: the op's stock path; Triton: its kernel), after the model, on
the step's restored logp in one call (a trainer computes its loss once per step). The upstream gradient is
the harness's loss reduction (``gradsweep.harness.execute.make_upstream``), so ``dlogp`` is the gradient the
fragment sends back into the model and ``value`` the reduced loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gradsweep.harness.execute import make_inputs, make_upstream
from gradsweep.layouts import Call, Segment
from gradsweep.ops.base import CallContext, Candidate, OpSpec
from gradsweep.ops.registry import get_op
from gradsweep.workload import Workload

RL_FRAGMENTS: tuple[str, ...] = ("rl_ratio", "rl_kl", "rl_ppo", "rl_grpo", "rl_grpo_seq", "rl_dpo")
ROLLOUT_INPUTS = ("old_logp", "ref_logp")


@dataclass
class FragmentRun:
    """One role's fragment outputs and dlogp (logical order), and each output's reduced loss value."""

    tensors: dict[str, Tensor]
    values: dict[str, float]


def fragment_candidate(op: OpSpec, family: str, declared: object | None) -> tuple[Candidate | None, str]:
    """The profile's own candidate for a fragment, or None and why (never another family's)."""
    if declared is not None:
        impl = getattr(declared, "impl", None)
        if impl is None:
            status = getattr(getattr(declared, "status", None), "value", "undeclared")
            return None, f"the profile declares {op.name} {status}: {getattr(declared, 'reason', '')}".rstrip(": ")
        return op.candidates[impl], ""
    own = f"{family}.{op.name}"
    if own in op.candidates:
        return op.candidates[own], ""
    return None, f"the {family} family has no {op.name} candidate (a profile never borrows another family's)"


def logical_call(workload: Workload) -> Call:
    rows = workload.logical_rows()
    segs, offset = [], 0
    for s, n in enumerate(workload.lengths):
        segs.append(Segment(s, 0, n, offset))
        offset += n
    return Call(rows, tuple(segs))


def run_fragment(op: OpSpec, cand: Candidate, shape: dict, workload: Workload, policy_logp: Tensor,
                 rollout_logp: Tensor, device: torch.device) -> FragmentRun:
    """Forward and backward of one fragment on the step's logical tokens; the policy logp carries the gradient."""
    call = logical_call(workload)
    inputs = make_inputs(op, shape, workload, call.rows, device)
    for spec in op.inputs:
        if spec.name in ROLLOUT_INPUTS:
            inputs[spec.name] = rollout_logp.detach().float()
    logp = policy_logp.detach().float().clone().requires_grad_(True)
    inputs["logp"] = logp
    ctx = CallContext(call, inputs, {}, {}, {}, shape, workload.lengths)
    with torch.enable_grad():
        outs = cand.run(ctx).tensors
        grads = make_upstream(op, shape, workload, call.rows, device)
        tensors = [outs[o.name] for o in op.outputs]
        torch.autograd.backward(tensors, grads)
    result = {o.name: outs[o.name].detach() for o in op.outputs}
    result["dlogp"] = logp.grad.detach() if logp.grad is not None else torch.zeros_like(logp)
    values = {o.name: float((outs[o.name].detach().double() * g.double()).sum()) for o, g in zip(op.outputs, grads)}
    return FragmentRun(result, values)


def fragment_shape(name: str, manifest_shapes: dict[str, dict]) -> dict:
    op = get_op(name)
    return op.shape_model.model_validate(manifest_shapes.get(name, {})).model_dump(exclude_none=True)


def trainer_view(ratio: Tensor, active: Tensor, clip_low: float, clip_high: float) -> dict:
    """What the trainer's PPO/GRPO step sees of the drift: the importance ratio of its logp over the rollout's
    on loss-carrying tokens, and the share of them the clip range cuts off (0 without drift)."""
    r = ratio.detach().double()[active.to(ratio.device)]
    if r.numel() == 0:
        return {"active_tokens": 0}
    outside = (r < 1.0 - clip_low) | (r > 1.0 + clip_high)
    return {"active_tokens": int(r.numel()), "ratio_max_abs_dev": float((r - 1.0).abs().max()),
            "ratio_mean_abs_dev": float((r - 1.0).abs().mean()), "clip_range": [1.0 - clip_low, 1.0 + clip_high],
            "clipped_fraction": float(outside.double().mean()), "ratio_not_one": int((r != 1.0).sum())}
