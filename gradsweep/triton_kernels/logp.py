"""Selected-token log-probability from logits: logp[r] = logits[r, t_r] - logsumexp(logits[r]).

Why it is batch-invariant: each row walks the vocabulary in blocks of a FIXED size
(``BLOCK_V``) in a fixed order with an online log-sum-exp, under a pinned launch configuration
(block size and warp count do not depend on R), so the in-block ``tl.sum`` reduces every row in
the same order whatever the batch.  The backward is element-wise (no reduction): any tiling.

Targets outside [0, V) (e.g. -100 on pad rows) give logp 0 and a zero gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from gradsweep.kernel_api import check_selected_logp, logp_outputs, run_function, selected_logp_function
from gradsweep.triton_kernels._common import INTERPRET, FastLaunch, cdiv, loop_bound, to_out

# Pinned forward configuration (a row's summation order follows BLOCK_V and the warps; never R).
# ROWS rows per program share one 2-D block whose layout repeats row after row; the interpreter
# takes many rows per program because its cost is per program.
BLOCK_V = 4096
FWD_WARPS = 8
FWD_ROWS = 32 if INTERPRET else 1
BWD_BLOCK_V = 512 if INTERPRET else 2048
BWD_ROWS = 64 if INTERPRET else 1


@triton.jit
def _logp_fwd_kernel(L, T, OUT, LSE, R, V, s_l, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rr = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rr < R
    r = tl.where(ok, rr, 0).to(tl.int64)
    rows = L + r[:, None] * s_l
    cols = tl.arange(0, BLOCK)
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    s = tl.zeros((ROWS,), tl.float32)
    for v0 in range(0, V, BLOCK):
        live = (v0 + cols[None, :]) < V
        x = tl.load(rows + v0 + cols[None, :], mask=live, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
        m = m_new
    lse = m + tl.log(s)
    t = tl.load(T + r)
    hit = (t >= 0) & (t < V)
    xt = tl.load(L + r * s_l + tl.where(hit, t, 0)).to(tl.float32)
    tl.store(OUT + r, tl.where(hit, xt - lse, 0.0), mask=ok)
    tl.store(LSE + r, lse, mask=ok)


@triton.jit
def _logp_bwd_kernel(L, T, LSE, G, D, R, V, s_l, s_d, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """dlogits[r, v] = g[r] * (onehot(v == t) - exp(l - lse)): element-wise, any tiling."""
    rr = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    ok = rr < R
    r = tl.where(ok, rr, 0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    live = ok[:, None] & (cols[None, :] < V)
    x = tl.load(L + r[:, None] * s_l + cols[None, :], mask=live, other=0.0).to(tl.float32)
    t = tl.load(T + r)
    g = tl.load(G + r)
    g = tl.where((t >= 0) & (t < V), g, 0.0)
    lse = tl.load(LSE + r)
    d = g[:, None] * (tl.where(cols[None, :] == t[:, None], 1.0, 0.0) - tl.exp(x - lse[:, None]))
    tl.store(D + r[:, None] * s_d + cols[None, :], to_out(d, D.dtype.element_ty), mask=live)


_FWD = FastLaunch(_logp_fwd_kernel)
_BWD = FastLaunch(_logp_bwd_kernel)


def logp_forward(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp fp32 [R], lse fp32 [R]); logits [R, V] with unit column stride."""
    r, v = logits.shape
    out, lse = logp_outputs(r, v, logits.device, "selected_logp")
    if r == 0:
        return out, lse
    grid = (cdiv(r, FWD_ROWS),)
    _FWD(grid, [logits, targets, out, lse, r, loop_bound(v), logits.stride(0)],
         {"ROWS": FWD_ROWS, "BLOCK": BLOCK_V}, num_warps=FWD_WARPS, num_stages=2)
    return out, lse


def logp_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor,
                  g: torch.Tensor) -> torch.Tensor:
    """dlogits [R, V] in the logits dtype."""
    r, v = logits.shape
    d = torch.empty(r, v, dtype=logits.dtype, device=logits.device)
    if r == 0 or v == 0:
        return d
    grid = (cdiv(r, BWD_ROWS), cdiv(v, BWD_BLOCK_V))
    _BWD(grid, [logits, targets, lse, g.float().contiguous(), d, r, v, logits.stride(0), d.stride(0)],
         {"ROWS": BWD_ROWS, "BLOCK": BWD_BLOCK_V}, num_warps=4)
    return d


SelectedLogpFn = selected_logp_function(logp_forward, logp_backward)


def selected_logp(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Batch-invariant selected-token log-prob, fp32 [R]; differentiable w.r.t. logits."""
    check_selected_logp(logits, targets)
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    return run_function(SelectedLogpFn, logits, targets.to(device=logits.device, dtype=torch.int64).contiguous())
