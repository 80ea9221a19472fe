"""The public API both kernel families implement, written once: argument checks and shared autograd wiring.

``gradsweep.triton_kernels.<op>`` and ``gradsweep.cuda_kernels.<op>`` promise the same functions with the same
arguments (the ops and gradsweep.nn call either through one adapter), so what a valid call is lives here, not
twice. A family module adds only what is its own (device and dtype checks of its launchers) and supplies its
launchers to the autograd Functions built here. Nothing here launches a kernel or imports a family.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from gradsweep.canonical import CanonicalFold, RowIdentity
from gradsweep.uploads import upload


# ------------------------------------------------------------------------------------------------ argument checks
def records_graph(*args: object) -> bool:
    """Whether a call must go through its autograd Function: grad mode on and some tensor argument requiring
    grad (other arguments are ignored). A plain loop: it runs on every call of every op."""
    if torch.is_grad_enabled():
        for a in args:
            if isinstance(a, torch.Tensor) and a.requires_grad:
                return True
    return False


class _NoGraph:
    """The ctx a Function's forward gets when the call records no graph: it keeps nothing."""

    def save_for_backward(self, *tensors: torch.Tensor) -> None:
        pass

    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None:
        pass

    def set_materialize_grads(self, value: bool) -> None:
        pass


def run_function(fn: type[torch.autograd.Function], *args):
    """``fn.apply(*args)``, or ``fn``'s forward alone when nothing would be recorded (grad mode off, or no tensor
    argument requiring grad): the same launches and bits without apply's host cost (~10 us, what an inference
    call of a small-M GEMM or a norm is bound by). Tensors must be top-level arguments."""
    if records_graph(*args):
        return fn.apply(*args)
    return fn.forward(_NoGraph(), *args)


def require_fold(fold: CanonicalFold | None, weight: torch.Tensor, op: str) -> None:
    """Fail early, in one line: a weight gradient has nowhere to go without a fold, and a fold's main grad
    (FP32 and contiguous by construction) must be shaped like the weight, on its device."""
    if fold is None:
        if weight.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"{op}: weight requires grad but fold is None; pass a CanonicalFold "
                             "(the weight gradient is folded into fold.main_grad, never returned)")
        return
    mg = fold.main_grad
    if mg.shape != weight.shape or mg.device != weight.device:
        raise ValueError(f"{op}: fold.main_grad must be shaped like the weight {tuple(weight.shape)} on "
                         f"{weight.device}, got {tuple(mg.shape)} on {mg.device}")


def check_linear(x: torch.Tensor, weight: torch.Tensor, rows: RowIdentity) -> None:
    """``det_linear(x [R, K], weight [N, K], rows, fold)`` (lm_head too)."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"det_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not match")
    if rows.num_rows != x.shape[0]:
        raise ValueError(f"det_linear: {rows.num_rows} row identities for {x.shape[0]} rows")


def check_linear_logp(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: RowIdentity) -> None:
    """``linear_logp(hidden [R, K], weight [V, K], targets [R], rows, fold)``."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"linear_logp: hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} "
                         "do not match")
    if targets.shape != (hidden.shape[0],) or rows.num_rows != hidden.shape[0]:
        raise ValueError("linear_logp: targets and rows must have one entry per hidden row")


def check_selected_logp(logits: torch.Tensor, targets: torch.Tensor) -> None:
    """``selected_logp(logits [R, V], targets [R])``."""
    if logits.dim() != 2 or targets.shape != (logits.shape[0],):
        raise ValueError(f"selected_logp: logits {tuple(logits.shape)}, targets {tuple(targets.shape)}")


def check_embedding(ids: torch.Tensor, weight: torch.Tensor) -> None:
    """``embedding(ids [R], weight [V, H], rows, fold)``: the shapes (a family checks its devices itself)."""
    if ids.dim() != 1 or weight.dim() != 2:
        raise ValueError(f"embedding: expected ids [R] and weight [V, H], got {tuple(ids.shape)}, "
                         f"{tuple(weight.shape)}")


def check_rms_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    """``rms_norm(x [R, H], weight [H], eps, rows, fold)``."""
    if x.dim() != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"rms_norm: expected x [R, H] and weight [H], got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")


def check_qk_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    """``qk_norm(x [R, heads, head_dim], weight [head_dim], eps, rows, fold)``."""
    if x.dim() != 3 or weight.shape != (x.shape[2],):
        raise ValueError(f"qk_norm: expected x [R, heads, head_dim] and weight [head_dim], got "
                         f"{tuple(x.shape)}, {tuple(weight.shape)}")


def check_pack(x: torch.Tensor, lengths: torch.Tensor) -> None:
    """``pack(x [B, L, H], lengths [B], starts)``."""
    if x.dim() != 3 or lengths.shape != (x.shape[0],):
        raise ValueError(f"pack: expected x [B, L, H] and lengths [B], got {tuple(x.shape)}, "
                         f"{tuple(lengths.shape)}")


def check_unpack(packed: torch.Tensor, lengths: torch.Tensor) -> None:
    """``unpack(packed [T, H], lengths [B], max_len, starts)``."""
    if packed.dim() != 2 or lengths.dim() != 1:
        raise ValueError(f"unpack: expected packed [T, H] and lengths [B], got {tuple(packed.shape)}, "
                         f"{tuple(lengths.shape)}")


def check_unpack_rows(lengths: list[int], total: int) -> None:
    """The samples' lengths must cover the packed rows exactly."""
    if sum(lengths) != total:
        raise ValueError(f"unpack: sum(lengths)={sum(lengths)} but packed has {total} rows")


def sample_table(lengths: list[int], starts: list[int] | None, device: torch.device) -> torch.Tensor:
    """pack / unpack's one small upload: int64 [3B] = each sample's length, first packed row, first padded slot
    (``starts``, default 0: right padding)."""
    firsts = [0]
    for n in lengths[:-1]:
        firsts.append(firsts[-1] + n)
    starts = [0] * len(lengths) if starts is None else starts
    return upload(torch.tensor(lengths + firsts + starts, dtype=torch.int64), device)


def logp_outputs(n_rows: int, vocab: int, device: torch.device, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The (logp, lse) outputs of a selected-token log-prob, fp32 [R] each; a row needs a vocabulary."""
    out = torch.empty(n_rows, dtype=torch.float32, device=device)
    lse = torch.empty(n_rows, dtype=torch.float32, device=device)
    if n_rows and vocab == 0:
        raise ValueError(f"{op}: empty vocabulary")
    return out, lse


# ------------------------------------------------------------------------------------------------ autograd wiring
Launcher = Callable[..., torch.Tensor]


def selected_logp_function(forward: Callable, backward: Launcher) -> type[torch.autograd.Function]:
    """logp = logits[r, t] - logsumexp(logits[r]) (fp32) from a family's ``forward(logits, targets) -> (logp,
    lse)``; backward dlogits = ``backward(logits, targets, lse, g)`` = g (onehot - softmax)."""

    class SelectedLogpFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets):  # type: ignore[override]
            out, lse = forward(logits, targets)
            ctx.save_for_backward(logits, targets, lse)
            return out

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            logits, targets, lse = ctx.saved_tensors
            d = backward(logits, targets, lse, g) if ctx.needs_input_grad[0] else None
            return d, None

    return SelectedLogpFn


def embedding_function(forward: Launcher, backward: Callable) -> type[torch.autograd.Function]:
    """weight[ids] from a family's ``forward(ids, weight)``; the backward folds dweight into the fold's main
    grad through ``backward(ids, dy, rows, fold)`` (the weight's returned gradient is None)."""

    class EmbeddingFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, ids, weight, rows, fold):  # type: ignore[override]
            ctx.save_for_backward(ids)
            ctx.rows, ctx.fold = rows, fold
            return forward(ids, weight)

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            (ids,) = ctx.saved_tensors
            if ctx.fold is not None:
                backward(ids, dy, ctx.rows, ctx.fold)
            return None, None, None, None

    return EmbeddingFn


def pack_functions(pack_forward: Launcher, unpack_forward: Launcher
                   ) -> tuple[type[torch.autograd.Function], type[torch.autograd.Function]]:
    """(pack, unpack) from a family's launchers ``pack_forward(x, lengths, starts)`` and ``unpack_forward(packed,
    lengths, max_len, starts)``: each is the other's adjoint, so each backward is the other's forward."""

    class PackFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, lengths, starts):  # type: ignore[override]
            ctx.lengths, ctx.starts, ctx.max_len = lengths, starts, x.shape[1]
            return pack_forward(x, lengths, starts)

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            return unpack_forward(dy, ctx.lengths, ctx.max_len, ctx.starts), None, None

    class UnpackFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, packed, lengths, max_len, starts):  # type: ignore[override]
            ctx.lengths, ctx.starts = lengths, starts
            return unpack_forward(packed, lengths, max_len, starts)

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            return pack_forward(dy, ctx.lengths, ctx.starts), None, None, None

    return PackFn, UnpackFn


def rope_function(apply: Callable, grad_dtype: torch.dtype | None = None) -> type[torch.autograd.Function]:
    """RoPE from a family's ``apply(x, positions, theta, inverse=)``: the backward is the inverse rotation of dy
    (cast to ``grad_dtype`` first when the family's launcher takes one dtype only)."""

    class RopeFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, positions, theta):  # type: ignore[override]
            ctx.save_for_backward(positions)
            ctx.theta = theta
            return apply(x, positions, theta, inverse=False)

        @staticmethod
        def backward(ctx, dy):  # type: ignore[override]
            (positions,) = ctx.saved_tensors
            g = dy if grad_dtype is None else dy.to(grad_dtype)
            return apply(g.contiguous(), positions, ctx.theta, inverse=True), None, None

    return RopeFn
