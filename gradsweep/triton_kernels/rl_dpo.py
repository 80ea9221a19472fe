"""DPO: -log sigmoid(beta * (rho_chosen - rho_rejected)) per preference pair, on every token of both sequences.

rho_s = sum over sample s's tokens (in position order) of in_response * (logp - ref_logp). Pairs are samples
(2k, 2k + 1): the even one chosen, the odd one rejected; a trailing unpaired sample has rho_rejected = 0.

Why it is batch-invariant: a sequence's sum is taken by one program that walks the sample's tokens in position
order through a host-built index map (never in physical row order), lane ``p % BLOCK`` taking position p, then
one fixed tree over the lanes; BLOCK and the warp count are pinned. The backward's per-pair sum of upstream
gradients is the same walk. Neither depends on where the sample sits in the call, on padding or on neighbours.

Why it needs each pair whole in one call: the loss of any token depends on the sum over both whole sequences,
which does not exist before their last token has been seen. A call holding part of a sequence is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from gradsweep.canonical import RowIdentity
from gradsweep.triton_kernels._common import FastLaunch, cdiv, loop_bound, to_out

SEQ_BLOCK = 256  # lanes of a sequence sum (pinned: the sum's order is a function of it and the position only)
SEQ_WARPS = 4
ROW_BLOCK = 1024


@triton.jit
def _seq_sum_kernel(A, B, M, ORDER, START, LEN, OUT, max_len, HAS_B: tl.constexpr, HAS_M: tl.constexpr,
                    BLOCK: tl.constexpr):
    """OUT[s] = sum over positions p of sample s of (A - B) * M (or A), at row ORDER[START[s] + p]."""
    s = tl.program_id(0)
    start = tl.load(START + s)
    n = tl.load(LEN + s)
    lanes = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for p0 in range(0, max_len, BLOCK):
        p = p0 + lanes
        live = p < n
        row = tl.load(ORDER + start + p, mask=live, other=0).to(tl.int64)
        v = tl.load(A + row, mask=live, other=0.0).to(tl.float32)
        if HAS_B:
            v = v - tl.load(B + row, mask=live, other=0.0).to(tl.float32)
        if HAS_M:
            v = v * tl.load(M + row, mask=live, other=0).to(tl.float32)
        acc += tl.where(live, v, 0.0)
    tl.store(OUT + s, tl.sum(acc, 0))


@triton.jit
def _pair(SEQ, s, real, N):
    """(chosen, rejected) sums of the pair of sample s; a missing rejected sample counts 0."""
    c = 2 * (s // 2)
    chosen = tl.load(SEQ + c, mask=real, other=0.0)
    rejected = tl.load(SEQ + c + 1, mask=real & (c + 1 < N), other=0.0)
    return chosen, rejected


@triton.jit
def _log1p(e):
    u = 1.0 + e
    return tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))


@triton.jit
def _dpo_fwd_kernel(SEQ, S, OUT, n, N, BETA, BLOCK: tl.constexpr):
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    s = tl.load(S + off, mask=m, other=-1)
    real = m & (s >= 0)
    s = tl.where(real, s, 0)
    chosen, rejected = _pair(SEQ, s, real, N)
    x = -BETA * (chosen - rejected)  # loss = softplus(-z), z = beta (chosen - rejected)
    loss = tl.maximum(x, 0.0) + _log1p(tl.exp(-tl.abs(x)))
    tl.store(OUT + off, tl.where(real, loss, 0.0), mask=m)


@triton.jit
def _dpo_bwd_kernel(SEQ, GSEQ, S, M, D, n, N, BETA, BLOCK: tl.constexpr):
    """dlogp = in_response * (+-beta) * (-sigmoid(-z)) * (sum of the pair's upstream gradients)."""
    off = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    s = tl.load(S + off, mask=m, other=-1)
    real = m & (s >= 0)
    s = tl.where(real, s, 0)
    chosen, rejected = _pair(SEQ, s, real, N)
    g_chosen, g_rejected = _pair(GSEQ, s, real, N)
    z = BETA * (chosen - rejected)
    dz = -1.0 / (1.0 + tl.exp(z))
    sign = tl.where(s % 2 == 0, BETA, -BETA)
    mask = tl.load(M + off, mask=real, other=0).to(tl.float32)
    grad = mask * sign * dz * (g_chosen + g_rejected)
    tl.store(D + off, to_out(tl.where(real, grad, 0.0), D.dtype.element_ty), mask=m)


def sequence_index(rows: RowIdentity, lengths: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Host plan: the call's rows of each sample in position order (ORDER, START, LEN per logical sample).

    Refuses a call that holds part of a sequence or one member of a pair without the other.
    """
    sample = rows.sample.cpu().numpy()
    position = rows.position.cpu().numpy()
    n_samples = len(lengths)
    real = np.nonzero(sample >= 0)[0]
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
    firsts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    if not np.array_equal(seq_pos, np.arange(len(order)) - np.repeat(firsts, counts)):
        raise ValueError("rl_dpo: a sample's positions are not 0..length-1 exactly once in this call")
    return (torch.as_tensor(order.astype(np.int32)), torch.as_tensor(firsts.astype(np.int32)),
            torch.as_tensor(counts.astype(np.int32)), int(counts.max(initial=0)))


_SEQ_SUM = FastLaunch(_seq_sum_kernel)
_DPO_FWD = FastLaunch(_dpo_fwd_kernel)
_DPO_BWD = FastLaunch(_dpo_bwd_kernel)


def _seq_sum(a, b, m, plan, device) -> torch.Tensor:
    order, start, count, max_len = plan
    out = torch.zeros(start.numel(), dtype=torch.float32, device=device)
    if start.numel() and max_len:
        dummy = a
        _SEQ_SUM((start.numel(),), [a, b if b is not None else dummy, m if m is not None else dummy, order, start,
                                    count, out, loop_bound(max_len)],
                 {"HAS_B": b is not None, "HAS_M": m is not None, "BLOCK": SEQ_BLOCK}, SEQ_WARPS)
    return out


class _DpoFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, ref, mask, sample, plan, beta):  # type: ignore[override]
        device = logp.device
        plan = tuple(p.to(device) if isinstance(p, torch.Tensor) else p for p in plan)
        lp, ref, mask = logp.contiguous(), ref.contiguous(), mask.contiguous()
        seq = _seq_sum(lp, ref, mask, plan, device)
        n, n_samples = lp.numel(), plan[1].numel()
        out = torch.empty(n, dtype=torch.float32, device=device)
        if n:
            _DPO_FWD((cdiv(n, ROW_BLOCK),), [seq, sample, out, n, n_samples, float(beta)], {"BLOCK": ROW_BLOCK}, 4)
        ctx.save_for_backward(lp, mask, sample, seq)
        ctx.plan, ctx.beta = plan, beta
        return out

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        lp, mask, sample, seq = ctx.saved_tensors
        gseq = _seq_sum(g.float().contiguous(), None, None, ctx.plan, lp.device)
        d = torch.empty_like(lp)
        n = lp.numel()
        if n:
            _DPO_BWD((cdiv(n, ROW_BLOCK),), [seq, gseq, sample, mask, d, n, seq.numel(), float(ctx.beta)],
                     {"BLOCK": ROW_BLOCK}, 4)
        return d, None, None, None, None, None


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
    plan = sequence_index(rows, lengths)
    sample = rows.sample.to(device=logp.device, dtype=torch.int64)
    return _DpoFn.apply(logp, ref_logp, in_response, sample, plan, beta)
