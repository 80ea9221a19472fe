"""DPO in CUDA C++ (gradsweep._C, csrc/rl.cu): -log sigmoid(beta * (rho_chosen - rho_rejected)) per preference
pair, on every token of both sequences. Same public API as ``gradsweep.triton_kernels.rl_dpo``.

rho_s = sum over sample s's tokens (in position order) of in_response * (logp - ref_logp). Pairs are samples
(2k, 2k + 1): the even one chosen, the odd one rejected; a trailing unpaired sample has rho_rejected = 0.

Why it is batch-invariant: a sequence's sum is taken by one CUDA block of a pinned size that walks the sample's
tokens in position order through a host-built index map (never in physical row order): thread t takes positions
t, t + RL_SEQ_THREADS, .., then a fixed butterfly over the threads. The backward's per-pair sum of upstream
gradients is the same walk. Neither depends on where the sample sits in the call, on padding or on neighbours.

Why it needs each pair whole in one call: the loss of any token depends on the sum over both whole sequences,
which does not exist before their last token has been seen. A call holding part of a sequence is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gradsweep.canonical import RowIdentity
from gradsweep.cuda_kernels import runtime as rt

_CODES = {torch.bfloat16: 0, torch.float32: 1}


def sequence_index(rows: RowIdentity, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Host plan: the call's rows of each sample in position order (ORDER, START, LEN per logical sample, int32).

    Refuses a call that holds part of a sequence or one member of a pair without the other.
    """
    sample = rows.sample.cpu().numpy().astype(np.int64)
    position = rows.position.cpu().numpy().astype(np.int64)
    n_samples = len(lengths)
    real = np.nonzero(sample >= 0)[0]
    if len(real) and int(sample[real].max()) >= n_samples:
        raise ValueError(f"rl_dpo: sample id {int(sample[real].max())} outside the step's {n_samples} samples")
    order = real[np.lexsort((position[real], sample[real]))]
    counts = np.bincount(sample[real], minlength=n_samples).astype(np.int64)
    present = counts > 0
    for s in np.nonzero(present)[0]:
        partner = s ^ 1
        if counts[s] != lengths[s]:
            raise ValueError(f"rl_dpo: sample {s} has {counts[s]} of its {lengths[s]} tokens in this call; DPO sums "
                             "a whole sequence before any token's loss exists, so give each pair whole in one call")
        if partner < n_samples and not present[partner]:
            raise ValueError(f"rl_dpo: sample {s} arrived without its pair partner {partner}; give both sequences "
                             "of a preference pair in the same call")
    seq_pos = position[order]
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    if not np.array_equal(seq_pos, np.arange(len(order)) - np.repeat(firsts, counts)):
        raise ValueError("rl_dpo: a sample's positions are not 0..length-1 exactly once in this call")
    return (torch.as_tensor(order.astype(np.int32)), torch.as_tensor(firsts.astype(np.int32)),
            torch.as_tensor(counts.astype(np.int32)), int(counts.max(initial=0)))


def _seq_sum(a: torch.Tensor, b: torch.Tensor | None, mask: torch.Tensor | None, code: int, plan) -> torch.Tensor:
    """Per logical sample: sum over its positions of (a - b) * mask (b, mask optional), FP32."""
    order, start, count, max_len = plan
    out = torch.zeros(start.numel(), dtype=torch.float32, device=a.device)
    if start.numel() and max_len:
        dev, stream = rt.launch(a)
        rt.ext().rl_seq_sum(rt.ptr(a), rt.ptr(b), rt.ptr(mask), rt.ptr(order), rt.ptr(start), rt.ptr(count),
                            rt.ptr(out), start.numel(), code, dev, stream)
    return out


class _DpoFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, ref, mask, sample, plan, beta):  # type: ignore[override]
        if logp.dtype == ref.dtype == torch.bfloat16:
            lp, ref, code = logp.contiguous(), ref.contiguous(), 0
        else:  # one dtype per launch: widen (exact)
            lp, ref, code = logp.float().contiguous(), ref.float().contiguous(), 1
        seq = _seq_sum(lp, ref, mask, code, plan)
        n, n_samples = lp.numel(), plan[1].numel()
        out = torch.empty(n, dtype=torch.float32, device=lp.device)
        if n:
            dev, stream = rt.launch(lp)
            rt.ext().rl_dpo(rt.ptr(seq), 0, rt.ptr(sample), rt.ptr(mask), rt.ptr(out), n, n_samples, float(beta), 1,
                            dev, stream)
        ctx.save_for_backward(mask, sample, seq)
        ctx.plan, ctx.beta, ctx.like = plan, beta, logp.new_empty(0)
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        mask, sample, seq = ctx.saved_tensors
        g32 = g.float().contiguous()
        gseq = _seq_sum(g32, None, None, 1, ctx.plan)
        dtype = ctx.like.dtype if ctx.like.dtype in _CODES else torch.float32
        n = sample.numel()
        d = torch.empty(n, dtype=dtype, device=seq.device)
        if n:
            dev, stream = rt.launch(seq)
            rt.ext().rl_dpo(rt.ptr(seq), rt.ptr(gseq), rt.ptr(sample), rt.ptr(mask), rt.ptr(d), n, seq.numel(),
                            float(ctx.beta), _CODES[dtype], dev, stream)
        return d.to(ctx.like.dtype), None, None, None, None, None


def dpo_loss(logp: torch.Tensor, ref_logp: torch.Tensor, in_response: torch.Tensor, rows: RowIdentity,
             lengths: Sequence[int], beta: float) -> torch.Tensor:
    """DPO's pair loss on every token of the pair, FP32 [R] (0 on pads and fillers); differentiable in logp.

    ``rows``: the call's row identities; ``lengths``: every logical sample's length (pairs are (2k, 2k+1)).
    """
    if logp.dim() != 1 or ref_logp.shape != logp.shape or in_response.shape != logp.shape:
        raise ValueError(f"dpo_loss: logp {tuple(logp.shape)}, ref_logp {tuple(ref_logp.shape)}, in_response "
                         f"{tuple(in_response.shape)}; give one value per row")
    if rows.num_rows != logp.shape[0]:
        raise ValueError(f"dpo_loss: {rows.num_rows} row identities for {logp.shape[0]} rows")
    for name, t in (("logp", logp), ("ref_logp", ref_logp), ("in_response", in_response)):
        rt.check_tensor(f"dpo_loss {name}", t, t.dtype)
    device = logp.device
    plan = tuple(p.to(device) if isinstance(p, torch.Tensor) else p for p in sequence_index(rows, lengths))
    mask = in_response.to(torch.float32).contiguous()
    sample = rows.sample.to(device=device, dtype=torch.int64).contiguous()
    return _DpoFn.apply(logp, ref_logp, mask, sample, plan, beta)
