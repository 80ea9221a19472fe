"""RL loss fragments as ops: every Triton fragment green on every layout it declares (under the interpreter),
judged by the sweep's own check_kernel; planted defects (a per-call denominator, advantages normalised over the
call instead of the group, a pad leaking into a sequence sum) are red. The harness's loss reductions are exact
weights that depend on logical identity only."""

from __future__ import annotations

import pytest
import torch

from gradsweep.harness.kernel_check import candidate_from, check_kernel
from gradsweep.ops import rl_common as rl
from gradsweep.ops.base import CallContext, CallOutput, kernel_module
from gradsweep.ops.registry import BUILTIN_OPS, get_op
from gradsweep.results import Status
from gradsweep.workload import Workload

# 7 samples: GRPO groups of 3 (the last one a single sample: advantage 0), DPO pairs (0,1) (2,3) (4,5) and an
# unpaired sample 6, a one-token sample; decode stays at 31 calls (the interpreter is slow).
LENGTHS = [23, 5, 31, 1, 12, 9, 4]
RL_OPS = ("rl_ratio", "rl_kl", "rl_ppo", "rl_grpo", "rl_grpo_seq", "rl_dpo")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN pads in the interpreter's numpy


def _reds(report) -> set[str]:
    return {lay for lay, s in report.statuses().items() if s == Status.RED_VERDICT}


@pytest.mark.parametrize("op", RL_OPS)
def test_triton_fragment_is_green_on_every_layout(op: str) -> None:
    assert op in BUILTIN_OPS
    spec = get_op(op)
    report = check_kernel(op, f"triton.{op}", lengths=LENGTHS)
    assert set(report.cells) == set(spec.layouts) and len(report.cells) >= 5
    assert report.ok, report.first_failure
    for verdict in report.cells.values():
        names = {t.name for t in verdict.tensors}
        assert "dlogp" in names and all(t.accuracy_ok is not False for t in verdict.tensors)


def test_dpo_declares_only_layouts_that_keep_a_pair_whole() -> None:
    layouts = set(get_op("rl_dpo").layouts)
    assert {"bn_full", "bn_padded_right", "bn_permuted", "bn_mask_density"} <= layouts
    assert not layouts & {"bn_chunked", "decode", "b1_singleton", "bn_neighbors", "prefix_cache"}


def test_dpo_kernel_refuses_a_split_sequence() -> None:
    mod = kernel_module("triton", "rl_dpo")
    from gradsweep.canonical import RowIdentity

    rows = RowIdentity(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))
    x = torch.zeros(3)
    with pytest.raises(ValueError, match="sample 0 has 2 of its 3 tokens"):
        mod.dpo_loss(x, x, torch.ones(3, dtype=torch.int64), rows, [3, 1], 0.1)


# -------------------------------------------------------------------------------- harness loss reductions
def test_loss_upstreams_are_the_reduction_weights() -> None:
    w = Workload(11, tuple(LENGTHS))
    rows = w.logical_rows()
    mask = w.active_mask(rows).double()
    token = w.loss_upstream("loss", rows, "token_mean")
    assert torch.equal(token, mask / w.active_denominator())
    seq = w.loss_upstream("loss", rows, "sequence_mean")
    active = mask.bool().tolist()
    per_sample = [sum(a for a, s in zip(active, rows.sample.tolist()) if s == k) for k in range(len(LENGTHS))]
    holding = sum(1 for n in per_sample if n)
    for r, (s, a) in enumerate(zip(rows.sample.tolist(), active)):
        assert float(seq[r]) == (1.0 / (per_sample[s] * holding) if a else 0.0)


@pytest.mark.parametrize("op, reduction", [("rl_ppo", "token_mean"), ("rl_grpo_seq", "sequence_mean"),
                                           ("rl_dpo", "sequence_mean")])
def test_the_harness_hands_loss_ops_their_reduction(op: str, reduction: str) -> None:
    from gradsweep.canonical import RowIdentity
    from gradsweep.harness.execute import make_upstream

    spec = get_op(op)
    w = Workload(11, tuple(LENGTHS))
    shape = spec.shape_model().model_dump()
    rows = RowIdentity(torch.tensor([2, -1, 0, 0, -2, 4]), torch.tensor([3, 0, 0, 1, 0, 5]))
    (g,) = make_upstream(spec, shape, w, rows, torch.device("cpu"))
    want = w.loss_upstream(spec.outputs[0].name, rows, reduction).to(torch.float32)
    assert g.dtype == torch.float32 and torch.equal(g[[0, 2, 3, 5]], want[[0, 2, 3, 5]])
    assert bool((~torch.isfinite(g[1]) | (g[1].abs() >= 1e4)).all()) and torch.isfinite(g[4])


def test_loss_upstream_gives_pads_garbage() -> None:
    from gradsweep.canonical import RowIdentity

    w = Workload(11, tuple(LENGTHS))
    rows = RowIdentity(torch.tensor([0, -1, -1, -2]), torch.tensor([0, 0, 1, 0]))
    g = w.loss_upstream("loss", rows, "token_mean")
    assert bool((~torch.isfinite(g[1:3]) | (g[1:3].abs() >= 1e4)).all())  # what an uninitialised buffer holds
    assert torch.isfinite(g[3]) and g[3] != 0


# ------------------------------------------------------------------------------------------ planted defects
def _per_call_denominator(ctx: CallContext) -> CallOutput:
    """PPO loss normalised by the call's own tokens instead of the step's (micro-batch averaging)."""
    out = get_op("rl_ppo").candidates["triton.rl_ppo"].run(ctx).tensors["loss"]
    in_call = int((ctx.rows.sample >= 0).sum())
    return CallOutput({"loss": out * (sum(ctx.lengths) / in_call)})


def test_planted_per_call_denominator_is_red() -> None:
    bad = candidate_from("rl_ppo", "planted.per_call_denominator", "triton", _per_call_denominator)
    report = check_kernel("rl_ppo", bad, lengths=LENGTHS, layouts=["bn_full", "bn_chunked", "b1_singleton",
                                                                  "decode"])
    assert report.statuses()["bn_full"] == Status.GREEN  # one call holds the step: nothing to see there
    assert {"bn_chunked", "b1_singleton", "decode"} <= _reds(report)


def _call_normalised_grpo(ctx: CallContext) -> CallOutput:
    """GRPO grouping the samples of this call in the order they arrive (a trainer grouping its batch rows)."""
    i, s = ctx.inputs, ctx.shape
    arrival: list[int] = []
    for v in ctx.rows.sample.tolist():
        if v >= 0 and v not in arrival:
            arrival.append(v)
    rewards = rl.sample_rewards(s["reward_seed"], len(ctx.lengths))[arrival]
    rank = {v: k for k, v in enumerate(arrival)}
    local_ids = torch.tensor([rank.get(v, -1) for v in ctx.rows.sample.tolist()], dtype=torch.int64)
    mod = kernel_module("triton", "rl_token")
    return CallOutput({"loss": mod.grpo_loss(i["logp"], i["old_logp"], i["ref_logp"], local_ids, rewards,
                                             s["group_size"], s["clip_low"], s["clip_high"], s["beta"],
                                             s["adv_eps"])})


def test_planted_call_local_group_normalisation_is_red() -> None:
    bad = candidate_from("rl_grpo", "planted.call_groups", "triton", _call_normalised_grpo)
    report = check_kernel("rl_grpo", bad, lengths=LENGTHS, layouts=["bn_full", "b1_singleton", "bn_permuted"])
    assert {"b1_singleton", "bn_permuted"} <= _reds(report)


def _leaky_dpo(ctx: CallContext) -> CallOutput:
    """Stock DPO that folds every row into the sequence sums by clamping ids: pads and fillers land in sample 0."""
    from gradsweep.ops.rl_dpo import dpo_terms

    i = ctx.inputs
    leaky = ctx.rows.sample.clamp(min=0)
    return CallOutput({"loss": dpo_terms(i["logp"].float(), i["ref_logp"].float(), i["in_response"], leaky,
                                         ctx.shape["beta"], len(ctx.lengths))})


def test_planted_pad_leak_into_a_sequence_sum_is_red() -> None:
    bad = candidate_from("rl_dpo", "planted.leaky", "torch", _leaky_dpo)
    report = check_kernel("rl_dpo", bad, lengths=LENGTHS)
    assert report.statuses()["bn_full"] == Status.GREEN
    assert {"bn_padded_right", "bn_padded_left", "bn_mask_density"} <= _reds(report)


def _bf16_rounded_ratio(ctx: CallContext) -> CallOutput:
    """The ratio stored through bf16 (an FP32 loss term rounded on the way): layout-invariant but inaccurate."""
    out = get_op("rl_ratio").candidates["triton.rl_ratio"].run(ctx).tensors["ratio"]
    return CallOutput({"ratio": out.bfloat16().float()})


def test_planted_bf16_rounded_loss_term_is_red_on_accuracy() -> None:
    bad = candidate_from("rl_ratio", "planted.bf16_ratio", "triton", _bf16_rounded_ratio)
    report = check_kernel("rl_ratio", bad, lengths=LENGTHS, layouts=["bn_full"])
    verdict = report.cells["bn_full"]
    assert verdict.status == Status.RED_VERDICT and "ratio forward_accuracy" in verdict.reason
