"""Selected-token log-probability from logits (gradsweep._C): logp[r] = logits[r, t_r] - logsumexp(logits[r]).

Why it is batch-invariant: one CUDA block per row with a constant block size (never a function of R);
each thread walks its fixed 8-element chunks of the row with an online log-sum-exp, then a fixed xor
butterfly combines the threads (csrc/logp.cu). The backward is element-wise. FP32 throughout; no torch
softmax on this path.

Targets outside [0, V) (e.g. -100 on pad rows) give logp 0 and a zero gradient.
"""

from __future__ import annotations

import torch

from gradsweep.cuda_kernels import runtime as rt
from gradsweep.kernel_api import check_selected_logp, logp_outputs, run_function, selected_logp_function


def logp_forward(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp fp32 [R], lse fp32 [R]); logits [R, V] bf16 with unit column stride."""
    r, v = logits.shape
    out, lse = logp_outputs(r, v, logits.device, "selected_logp")
    if r == 0:
        return out, lse
    dev, stream = rt.launch(logits)
    rt.ext().logp_fwd(rt.ptr(logits), rt.ptr(targets), rt.ptr(out), rt.ptr(lse), r, v, logits.stride(0), dev,
                      stream)
    return out, lse


def logp_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                  g: torch.Tensor) -> torch.Tensor:
    """dlogits [R, V] in bf16: g (onehot(target) - exp(logits - lse))."""
    r, v = logits.shape
    d = torch.empty(r, v, dtype=logits.dtype, device=logits.device)
    if r == 0 or v == 0:
        return d
    g = g.to(torch.float32).contiguous()
    dev, stream = rt.launch(logits)
    rt.ext().logp_bwd(rt.ptr(logits), rt.ptr(targets), rt.ptr(lse), rt.ptr(g), rt.ptr(d), r, v, logits.stride(0),
                      d.stride(0), dev, stream)
    return d


SelectedLogpFn = selected_logp_function(logp_forward, logp_backward)


def selected_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Batch-invariant selected-token log-prob, fp32 [R]; differentiable w.r.t. logits (bf16 [R, V])."""
    check_selected_logp(logits, targets)
    rt.check_tensor("selected_logp logits", logits)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return run_function(SelectedLogpFn, logits, targets.to(device=logits.device, dtype=torch.int64).contiguous())
