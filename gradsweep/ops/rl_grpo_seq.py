"""rl_grpo_seq: GRPO's per-token loss with per-sequence aggregation (each sequence's masked token mean, then
the mean over sequences), the reduction fixed by the harness (``OutputSpec.upstream='sequence_mean'``)."""

from __future__ import annotations

from gradsweep.ops.rl_grpo import grpo_op

OP = grpo_op("rl_grpo_seq", "sequence_mean", "per-sequence aggregation (mean over sequences of token means)")
